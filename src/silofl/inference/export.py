"""``silofl export``: a site's model as ONNX (preprocessing inside the graph) with a model card.

With a feature stage (``--features``, :mod:`silofl.features`) the graph holds it too when torch's exporter can
trace it (a backbone); otherwise (kymatio's scattering: complex FFTs) the export has two stages:
``model.onnx`` takes the *features* (``features``), which silofl computes (``silofl predict``, or
``silofl.features.stage_from_record(json.load(open("features.json")))``), and ``features.json`` names the
stage exactly. The model card says which, what the features are and why they cost no budget.

``OUT/model.onnx`` takes the *raw* inputs (``x``: a table's features in schema order, numbers as they are and
categories as level indices, NaN where missing; or images in [0, 1] at the run's size) and returns class
probabilities (``probabilities``); the site's scaling, filling and one-hot encoding run inside the graph, so a
serving stack needs onnxruntime and nothing of silofl. ``OUT/preprocessing.json`` documents the same steps
(and the level lists to turn categories into indices). ``OUT/model_card.json`` and ``.md`` say what the model
is, what data it was trained on, what privacy guarantee covers it — and what does not.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import shutil
from pathlib import Path
from typing import Any

import torch

from silofl.core.errors import ConfigError
from silofl.core.extras import require
from silofl.data.preprocessing import TablePreprocessing
from silofl.inference.pipeline import LoadedModel, load_pipeline

FORMATS = ("onnx",)
CARD_FORMAT = "silofl.model-card/1"


def example_input(loaded: LoadedModel, n: int = 2) -> torch.Tensor:
    """A batch of ``n`` valid raw inputs (for tracing)."""
    prep = loaded.preprocessing
    if isinstance(prep, TablePreprocessing):
        return torch.zeros(n, len(prep.schema.features))
    return torch.full((n, *prep.input_shape), 0.5)


def export(
    path: str | Path,
    client: int,
    out: str | Path,
    model: str = "private",
    fmt: str = "onnx",
    overwrite: bool = False,
) -> dict:
    """Write ``model.onnx``, ``preprocessing.json``, ``model_card.json`` and ``model_card.md`` under ``out``;
    returns the card."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format takes {', '.join(FORMATS)}, got {fmt!r}")
    for module in ("onnx", "onnxscript"):  # torch's exporter imports them; checked before anything is written
        require(module, "export", "silofl export --format onnx")
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"{out} exists and is not empty; choose another --out or pass --overwrite")
    loaded = load_pipeline(path, client, model)
    out.mkdir(parents=True, exist_ok=True)
    onnx_path = out / "model.onnx"
    graph = "one"
    if loaded.features is not None:
        from silofl.features import stage_from_record

        if not stage_from_record(loaded.features).in_onnx:
            graph = "two-stage"
            export_head(loaded, onnx_path)
        else:
            try:
                export_onnx(loaded, onnx_path)
            except ConfigError:
                raise
            except Exception:  # noqa: BLE001 - the exporter cannot trace the feature stage: export the head alone
                graph = "two-stage"
                export_head(loaded, onnx_path)
        (out / "features.json").write_text(json.dumps(loaded.features, indent=1) + "\n")
    else:
        export_onnx(loaded, onnx_path)
    shutil.copyfile(loaded.models_dir / f"client{client}_preprocessing.json", out / "preprocessing.json")
    card = model_card(loaded, onnx_path, graph)
    (out / "model_card.json").write_text(json.dumps(card, indent=2) + "\n")
    (out / "model_card.md").write_text(card_markdown(card))
    return card


def export_onnx(loaded: LoadedModel, path: Path) -> None:
    """The pipeline as an ONNX graph with a dynamic batch dimension (torch's exporter)."""
    import warnings

    x = example_input(loaded)
    batch = torch.export.Dim("batch")
    quiet = [
        logging.getLogger(name) for name in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")
    ]
    levels = [lg.level for lg in quiet]
    for lg in quiet:  # the exporter logs every op library it skips (torchvision's, absent here)
        lg.setLevel(logging.ERROR)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(
                loaded.pipeline,
                (x,),
                str(path),
                input_names=["x"],
                output_names=["probabilities"],
                dynamic_shapes=({0: batch},),
                external_data=False,
                verbose=False,
            )
        except ImportError as e:  # onnx / onnxscript missing
            raise ConfigError(
                f"ONNX export needs the onnx and onnxscript packages ({e}): pip install 'silofl[export]'"
            ) from None
        finally:
            for lg, level in zip(quiet, levels, strict=True):
                lg.setLevel(level)


class _Head(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.model(f), dim=1)


def export_head(loaded: LoadedModel, path: Path) -> None:
    """The model alone (features in, probabilities out) as ONNX: the second stage of a two-stage export."""
    import warnings

    f = torch.zeros(2, *loaded.spec.input_shape)
    batch = torch.export.Dim("batch")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _Head(loaded.pipeline.model).eval(),
            (f,),
            str(path),
            input_names=["features"],
            output_names=["probabilities"],
            dynamic_shapes=({0: batch},),
            external_data=False,
            verbose=False,
        )


def _features_card(loaded: LoadedModel, graph: str) -> dict | None:
    rec = loaded.features
    if rec is None:
        return None
    where = (
        "inside the graph, between the preprocessing and the model"
        if graph == "one"
        else "NOT in the graph (two-stage export): compute the features with silofl — `silofl predict`, or "
        "silofl.features.stage_from_record(features.json) — and feed them to model.onnx as `features`"
    )
    return {
        "stage": rec.get("features"),
        "description": rec.get("description"),
        "feature_shape": rec.get("feature_shape"),
        "where": where,
        "graph": graph,
        "privacy": f"no budget: {rec.get('privacy')}",
    }


def _round(v: Any, nd: int = 4) -> Any:
    return round(v, nd) if isinstance(v, float) and math.isfinite(v) else v


def model_card(loaded: LoadedModel, onnx_path: Path | None = None, graph: str = "one") -> dict:
    """What the model is, its training data, its privacy and its evaluation (from the run's files)."""
    prep = loaded.preprocessing
    k, role = loaded.client, loaded.role
    summary = _read_json(loaded.run_dir / "summary.json") if loaded.run_dir else None
    n_params = sum(p.numel() for p in loaded.pipeline.model.parameters())
    card: dict[str, Any] = {
        "format": CARD_FORMAT,
        "model": {
            "client": k,
            "site": prep.site or None,
            "role": role,
            "architecture": loaded.spec.name,
            "input_shape": list(loaded.spec.input_shape),
            "classes": prep.classes,
            "parameters": n_params,
            "file": onnx_path.name if onnx_path else None,
            "onnx": {
                "input": "x: float32 [batch, "
                + ", ".join(str(s) for s in _raw_shape(loaded))
                + "] — "
                + prep.to_dict()["input"],
                "output": _output_note(loaded),
                "preprocessing": "inside the graph: " + prep.to_dict()["steps"],
            },
        },
        **({"features": _features_card(loaded, graph)} if loaded.features is not None else {}),
        "training_data": _training_data(loaded, summary),
        "privacy": _privacy(loaded, summary),
        "evaluation": _evaluation(loaded, summary),
    }
    if graph == "two-stage":
        card["model"]["onnx"].update(
            {
                "input": "features: float32 [batch, "
                + ", ".join(str(s) for s in loaded.spec.input_shape)
                + "] — the "
                "feature stage's output (features.json) on the preprocessed inputs",
                "preprocessing": "NOT in the graph (two-stage export): "
                + prep.to_dict()["steps"]
                + ", then the feature "
                "stage, both computed by silofl",
            }
        )
    parts = getattr(loaded.pipeline.model, "roles", None)
    if role == "combined" and parts:  # silofl.site.combine: the site's own model fused with the DP one(s)
        card["model"]["architecture"] = "combined: " + " + ".join(parts)
        card["model"]["parts"] = parts
        card["model"]["combiner"] = (
            "logits = weight · concat(log_softmax(part(x))) + bias, fitted on rows held out "
            "from the site's own training rows"
        )
    if summary:
        card["run"] = {
            "folder": str(loaded.run_dir),
            "method": summary.get("method"),
            "rounds_run": summary.get("rounds_run"),
            "privacy_mode": summary["privacy"]["mode"],
        }
    return card


def _output_note(loaded: LoadedModel) -> str:
    """What the graph returns: class probabilities, or per-pixel ones for a segmentation model."""
    with torch.no_grad():
        out = loaded.pipeline(example_input(loaded, 1))
    if getattr(loaded.pipeline, "risk", False):
        return (
            "risk scores: float32 [batch] — log of the summed piecewise-exponential bin hazards (higher: the "
            "event sooner; silofl.training.survival.risk_score)"
        )
    if out.dim() == 4:
        return (
            f"per-pixel probabilities: float32 [batch, classes, {out.shape[2]}, {out.shape[3]}] (the mask "
            "is the arg-max over classes)"
        )
    return "probabilities: float32 [batch, classes]"


def _raw_shape(loaded: LoadedModel) -> list[int]:
    return list(example_input(loaded, 1).shape[1:])


def _read_json(p: Path) -> dict | None:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def _read_yaml(p: Path) -> dict | None:
    import yaml

    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def _training_data(loaded: LoadedModel, summary: dict | None) -> dict:
    prep = loaded.preprocessing
    d: dict[str, Any] = {"kind": prep.kind, "rows": prep.rows, "site": prep.site or None}
    if summary:
        sites = summary.get("sites") or []
        d["dataset"] = summary.get("dataset")
        if loaded.client < len(sites):
            d["site"] = sites[loaded.client]
        d["source"] = summary.get("data_source")
        cfg = _read_yaml(loaded.run_dir / "config.yaml") if loaded.run_dir else None
        site_data = (cfg or {}).get("site_data") or []
        if loaded.client < len(site_data):
            d["source"] = site_data[loaded.client]
    if isinstance(prep, TablePreprocessing):
        d["schema"] = prep.schema.to_dict()
    else:
        d["images"] = {"size": prep.image_size, "mode": prep.mode, "classes": prep.classes}
    stats = prep.site_statistics
    d["preprocessing_statistics"] = (
        f"NOT differentially private: {', '.join(stats)} of the site's own training rows are in the graph "
        f"and in "
        "preprocessing.json"
        if stats
        else "public: only the schema's declared bounds, fills and levels (nothing computed "
        "from the site's rows)"
    )
    return d


def _privacy(loaded: LoadedModel, summary: dict | None) -> dict:
    k, role = loaded.client, loaded.role
    stats = loaded.preprocessing.site_statistics
    extra = (
        (
            f" The preprocessing shipped with it holds statistics of the site's rows ({', '.join(stats)}) "
            f"that no "
            "DP mechanism protects."
        )
        if stats
        else ""
    )
    if summary is None:
        return {
            "differentially_private": None,
            "statement": "no summary.json next to the models: the privacy of this model is unknown." + extra,
        }
    priv = summary["privacy"]
    if priv["mode"] == "off":
        return {
            "differentially_private": False,
            "epsilon": None,
            "delta": None,
            "statement": "trained without differential privacy (privacy off): it can reveal the training "
            "rows; keep "
            "it where the data may go." + extra,
        }
    acct: dict = next((a for a in summary.get("accounting", []) if a.get("client") == k), {})
    client_level = "epsilon_hospital" in priv
    if client_level:
        dp = role == "global"
        eps = priv.get(f"epsilon_{priv.get('privacy_unit', 'hospital')}")
        inputs = {
            "noise_multiplier": priv.get("noise_multiplier_total"),
            "client_rate": priv.get("client_rate"),
            "rounds": summary.get("rounds_run"),
            "accountant": priv.get("accountant"),
        }
    else:
        dp = acct.get("dp_model") == role
        eps = acct.get("epsilon")
        inputs = {
            key: acct.get(key) for key in ("noise_multiplier", "sample_rate", "steps", "accountant", "clip")
        }
    if role == "combined":
        return {
            "differentially_private": False,
            "epsilon": None,
            "delta": None,
            "label": "non-private",
            "statement": "NOT differentially private: the combined model contains the site's own model, "
            "trained on "
            "its own rows without noise, and a combiner fitted on its held-out rows without noise (the DP "
            "parts "
            "it fuses keep their own guarantees, but nothing bounds what the combination reveals about this "
            "site's rows). It is the site's to keep; release it only where the data itself may go." + extra,
        }
    if not dp:
        return {
            "differentially_private": False,
            "epsilon": None,
            "delta": None,
            "statement": f"NOT differentially private: the {role} model was trained on the site's own rows "
            f"without "
            "noise (what it learnt from other sites' DP models is post-processing, but nothing bounds what "
            "it "
            "reveals about this site's rows). It is the site's to keep; release it only where the data "
            "itself may "
            "go." + extra,
        }
    formal = bool(priv.get("formal_guarantee"))
    unit = priv.get("unit")
    statement = (
        f"({_round(eps)}, {priv['delta']:g})-DP for {unit}, from "
        f"{inputs.get('accountant') or priv.get('accountant')} "
        f"fed with the mechanism that ran; {priv.get('note')}."
    )
    if not formal:
        statement = "NOT a formal guarantee: " + statement
    warning = summary.get("privacy_unit_warning")  # a repeated person id without --id-column: ε is per row
    if warning:
        statement += f" Per row, not per person: {warning.get('message')}."
    return {
        "differentially_private": True,
        "formal_guarantee": formal,
        "epsilon": eps,
        "delta": priv["delta"],
        "unit": unit,
        "what_was_released": f"the {role} model's weights (and anything computed from them)",
        "accountant_inputs": inputs,
        "statement": statement + extra,
        **(
            {"epsilon_hospital": priv["epsilon_hospital"], "epsilon_subclient": priv["epsilon_subclient"]}
            if client_level
            else {}
        ),
    }


def _evaluation(loaded: LoadedModel, summary: dict | None) -> dict:
    if summary is None:
        return {}
    row: dict = next((r for r in summary["final"]["per_client"] if r["client"] == loaded.client), {})
    from silofl.training.metrics import METRICS, metric_field

    key = f"{loaded.role}_acc"
    # every metric the run's task computes (summary.json's "computed"; silofl.training.metrics) of its last
    # evaluation of this model; null where not recorded
    computed = (summary.get("metrics") or {}).get("computed") or list(METRICS)
    names = [m for m in METRICS if m in computed]
    metrics = {m: row.get(metric_field(key, m)) for m in names}
    metrics_internal = {m: row.get(metric_field(key, m) + "_internal") for m in names}
    return {
        "test_set": summary.get("test_set"),
        "accuracy_external": row.get(key),
        "accuracy_internal": row.get(f"{key}_internal"),
        "round": row.get("round"),
        "internal_test_set": "the site's own held-out rows"
        if row.get(f"{key}_internal") is not None
        else None,
        "metrics_external": metrics,
        "metrics_internal": metrics_internal,
        "headline_metric": summary.get("metric", "accuracy"),
    }


def card_markdown(card: dict) -> str:
    """The model card as Markdown."""
    m, data, priv, ev = card["model"], card["training_data"], card["privacy"], card["evaluation"]
    lines = [
        f"# Model card: client {m['client']} ({m['site'] or 'site ' + str(m['client'])}), {m['role']} model",
        "",
        "## Model",
        "",
        f"- architecture: `{m['architecture']}`, {m['parameters']} parameters, input shape "
        f"{m['input_shape']}",
        f"- classes: {', '.join(m['classes'])}",
        f"- file: `{m['file']}` (ONNX)" if m.get("file") else "- file: —",
        f"- input: {m['onnx']['input']}",
        f"- output: {m['onnx']['output']}",
        f"- preprocessing: {m['onnx']['preprocessing']} (also in `preprocessing.json`)",
        "",
        "## Privacy",
        "",
        f"**{priv['statement']}**",
        "",
    ]
    if card.get("features"):
        fc = card["features"]
        lines[-4:-4] = [
            f"- features: {fc['description']} → {fc['feature_shape']}; {fc['where']}",
            f"- features and privacy: {fc['privacy']}",
        ]
    if priv.get("differentially_private"):
        lines += [
            f"- ε = {_round(priv['epsilon'])}, δ = {priv['delta']:g}, unit: {priv['unit']}",
            f"- released: {priv['what_was_released']}",
            "- accountant inputs: "
            + ", ".join(f"{k} = {_round(v)}" for k, v in priv["accountant_inputs"].items() if v is not None),
            "",
        ]
    lines += [
        "## Training data",
        "",
        f"- site: {data.get('site')}, {data['rows']} training rows"
        + (f" ({data.get('source')})" if data.get("source") else ""),
        f"- preprocessing statistics: {data['preprocessing_statistics']}",
    ]
    if data["kind"] == "table":
        sch = data["schema"]
        tgt = sch["target"]
        lines += [
            f"- target: survival, time `{tgt['time']}`, event `{tgt['event']}`, public time bins (inner "
            f"edges) {tgt.get('bins', [])}"
            if tgt.get("type") == "survival"
            else f"- target: `{tgt['name']}` ∈ {{{', '.join(tgt['levels'])}}}",
            "",
            "| feature | type | levels / bounds | missing |",
            "|---|---|---|---|",
        ]
        for name, f in sch["features"].items():
            what = (
                ", ".join(f["levels"])
                if f["type"] == "categorical"
                else (f"[{f['bounds'][0]:g}, {f['bounds'][1]:g}]" if "bounds" in f else "—")
            )
            lines.append(f"| {name} | {f['type']} | {what} | {f['missing']} |")
    else:
        im = data["images"]
        lines.append(f"- images: {im['size']}×{im['size']}, {'grey' if im['mode'] == 'L' else 'RGB'}")
    lines += ["", "## Evaluation", ""]
    if ev:
        lines += [
            f"- accuracy on {ev['test_set']}: {_fmt(ev['accuracy_external'])}",
            f"- accuracy on the site's own held-out rows: {_fmt(ev['accuracy_internal'])}",
            f"- after round {ev['round']}",
        ]
        if ev.get("headline_metric") == "c_index":  # a survival model: accuracy is not defined
            lines = lines[:-3] + lines[-1:]
        for where, ms in (
            ("on " + str(ev["test_set"]), ev.get("metrics_external")),
            ("on the site's own held-out rows", ev.get("metrics_internal")),
        ):
            if ms and ms.get("c_index") is not None:  # a survival model (silofl.training.survival)
                lines.append(f"- {where}: C-index {_fmt(ms['c_index'])} (Harrell's, of the risk scores)")
            elif ms and any(v is not None for k, v in ms.items() if k != "accuracy"):
                lines.append(
                    f"- {where}: AUROC {_fmt(ms.get('auroc'))}, balanced accuracy "
                    f"{_fmt(ms.get('balanced_accuracy'))}, F1 (macro) {_fmt(ms.get('f1'))}, ECE (15 bins) "
                    f"{_fmt(ms.get('ece'))}"
                )
    else:
        lines.append("- no evaluation recorded (no summary.json next to the models)")
    if card.get("run"):
        r = card["run"]
        lines += [
            "",
            f"Run: `{r['folder']}` ({r['method']}, {r['rounds_run']} rounds, privacy {r['privacy_mode']}).",
        ]
    return "\n".join(lines) + "\n"


def _fmt(v: Any) -> str:
    return "—" if v is None else f"{v:.4f}"
