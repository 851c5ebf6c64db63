"""Every public function, class and method of the package says what it does (a method that overrides a
documented one inherits its docstring)."""

import importlib
import inspect
import pkgutil

import silofl


def public_objects():
    for mod_info in pkgutil.walk_packages(silofl.__path__, "silofl."):
        module = importlib.import_module(mod_info.name)
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(obj):
                yield f"{module.__name__}.{name}", obj
            elif inspect.isclass(obj):
                yield f"{module.__name__}.{name}", obj
                for attr, member in vars(obj).items():
                    if attr.startswith("_") or not (
                        inspect.isfunction(member) or isinstance(member, property)
                    ):
                        continue
                    yield f"{module.__name__}.{name}.{attr}", getattr(obj, attr)


def test_public_functions_classes_and_methods_have_docstrings():
    missing = sorted(name for name, obj in public_objects() if not (inspect.getdoc(obj) or "").strip())
    assert not missing, f"{len(missing)} without a docstring:\n" + "\n".join(missing)
