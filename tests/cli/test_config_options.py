"""The CLI generated from the config: every flag of the hand-written CLI is still there, the commands share
the generated flags, a plug-in method's options become flags without editing silofl, and the value forms
(comma lists, two-value options, --clip adaptive:C0, --report-nonprivate/--keep-nonprivate) and precedence
(flags > --set > --config > defaults) hold."""

import json
from dataclasses import dataclass, field

import click
import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from silofl.cli.config_options import (
    config_command,
    generated_flags,
    missing_help,
    option_fallback_help,
    run_options,
)
from silofl.cli.main import app
from silofl.fl import registry
from silofl.fl.methods.fedavg import FedAvg, FedAvgOptions

runner = CliRunner()

# every flag `silofl run` had before it was generated (6ae87b4), hidden ones included — but --distributed:
# launched processes are started with data (silofl.runner.entry), not a `silofl run` command line
OLD_RUN_FLAGS = """
--config --method --dataset --data-dir --site-data --schema --test-data --test-fraction --clients
--rounds --seed --out --privacy --device --threads --private-model --proxy-model --partition
--p-major --dirichlet-alpha --samples-per-client --batch-size --lr --noise-multiplier --clip --delta
--accountant --target-epsilon --target-epsilons --dml-alpha --dml-beta --graph --self-weight
--aggregation --optimizer-state --dp-backend --privacy-unit --intermediaries --client-rate
--server-lr --local-epochs --local-lr --optimizer --momentum --nesterov --no-nesterov --ema-decay
--augmult --aug-pad --aug-flip --no-aug-flip --sample-rate --local-steps --server-momentum --mu
--ditto-lambda --mrmtl-lambda --private-lr --report-nonprivate --keep-nonprivate --combine
--combine-holdout --eval-every --test-limit --checkpoint-every --resume --overwrite
--peer-timeout --set --quiet --engine --deploy-timeout --insecure --restart-sites --deployment
--superlink --vs-alone --features --metric""".split()
OLD_AUDIT_FLAGS = """
--out --canaries --canary-kind --audited-site --reference-models --nonmembers --confidence
--pubsub-model --epsilon --epochs --config --method --dataset --data-dir --clients --rounds --seed
--privacy --private-model --proxy-model --partition --samples-per-client --batch-size --lr
--noise-multiplier --clip --delta --accountant --intermediaries --privacy-unit --client-rate
--server-lr --local-epochs --local-lr --eval-every --test-limit --threads --set --overwrite --quiet""".split()
OLD_COMPARE_FLAGS = """
--config --methods --seeds --preset --out --jobs --resume --report-only --comm-clients --dataset
--data-dir --rounds --clients --samples-per-client --batch-size --privacy --private-model
--proxy-model --eval-every --test-limit --threads --set --quiet --features --metric""".split()
OLD_TUNE_FLAGS = """
--method --target-epsilon --grid --config --out --set --quiet --progress --random-trials
--max-trials --features --metric""".split()


def flags_of(*path: str) -> set[str]:
    cmd = get_command(app)
    for name in path:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    ctx = click.Context(cmd)
    return {o for p in cmd.get_params(ctx) for o in (*p.opts, *p.secondary_opts)}


@pytest.mark.parametrize(
    "path,old",
    [
        (("run",), OLD_RUN_FLAGS),
        (("audit",), OLD_AUDIT_FLAGS),
        (("compare",), OLD_COMPARE_FLAGS),
        (("tune",), OLD_TUNE_FLAGS),
    ],
)
def test_every_old_flag_is_still_there(path, old):
    assert set(old) <= flags_of(*path), sorted(set(old) - flags_of(*path))


def test_commands_share_the_generated_flags():
    shared = {"--target-epsilon", "--dml-alpha", "--device", "--noise-multiplier", "--mu", "--features"}
    for path in (("run",), ("audit",), ("compare",), ("tune",), ("deploy", "local"), ("deploy", "start")):
        assert shared <= flags_of(*path), path
    assert "--clients" not in flags_of("deploy", "local") and "--sites" in flags_of("deploy", "local")
    assert "--seed" not in flags_of("compare") and "--seeds" in flags_of("compare")
    assert len([f for f in flags_of("run") if f == "--lr"]) == 1  # shared by many methods: one flag


def test_help_has_panels_choices_and_defaults_and_version():
    r = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    for panel in ("Data", "Privacy", "Method", "Engine", "Output"):
        assert f"─ {panel} " in r.output
    assert "fashion-mnist|mnist" in r.output and "proxyfl|fedavg|fml" in r.output and "rdp|prv" in r.output
    assert "[default: (300)]" in r.output  # --rounds shows the config's default
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.startswith("silofl ")


# ---------------------------------------------------------------------------------------------- a plug-in
# method
SEEN: list = []


@dataclass
class KnobOptions(FedAvgOptions):
    knob: float = field(default=1.0, metadata={"help": "A plug-in's own option.", "panel": "method"})
    pair: tuple[str, str] | None = None


class KnobMethod(FedAvg):
    def make_site(self, k, x, y, data):
        SEEN.append((self.opts.knob, self.opts.pair))
        return super().make_site(k, x, y, data)


@pytest.fixture
def knob_method():
    registry.register(
        "knobavg",
        options=KnobOptions,
        headline="global_acc",
        exchange="server",
        metrics=("global_acc",),
        description="FedAvg with a knob (test plug-in)",
    )(KnobMethod)
    SEEN.clear()
    yield
    registry.METHODS.unregister("knobavg")


def test_a_plug_in_methods_options_become_flags(knob_method):
    r = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert (
        r.exit_code == 0
        and "--knob" in r.output
        and "A plug-in's own option." in r.output
        and "--pair" in r.output
    )
    flags = generated_flags()
    assert flags["knob"].methods == ("knobavg",) and flags["pair"].kind == "pair"
    r = runner.invoke(app, ["run", "--method", "fedavg", "--knob", "2", "--out", "x"])  # not fedavg's option
    assert r.exit_code == 2 and "option knob does not apply to method 'fedavg'" in " ".join(r.output.split())


def test_every_built_in_option_says_its_help_and_a_plug_in_gets_a_fallback(knob_method):
    # every built-in method's option carries its help in its field (silofl.fl.options.option), none in a table
    assert missing_help() == []
    flags = generated_flags()
    assert flags["lr"].help == "DP-SGD methods: the DP model's learning rate."
    # an option two kinds of method define with different texts shows both
    assert "FedAvg/FML" in flags["server_lr"].help and "Client-level DP" in flags["server_lr"].help
    # a plug-in's field without metadata: the generic line (and it is not a built-in's missing help)
    assert flags["pair"].help == option_fallback_help("pair") == "The pair option."


@pytest.mark.slow  # one tiny run (about 1 s of CPU)
def test_a_plug_in_methods_flag_takes_effect(knob_method, tmp_path):
    out = tmp_path / "k"
    r = runner.invoke(
        app,
        [
            "run",
            "--method",
            "knobavg",
            "--knob",
            "2.5",
            "--pair",
            "a",
            "b",
            "--dataset",
            "digits",
            "--clients",
            "2",
            "--rounds",
            "1",
            "--samples-per-client",
            "60",
            "--batch-size",
            "20",
            "--delta",
            "1e-3",
            "--test-limit",
            "60",
            "--proxy-model",
            "mlp",
            "--quiet",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    assert SEEN == [(2.5, ("a", "b"))] * 2  # every site of the method got the flag's value
    assert "knob: 2.5" in (out / "config.yaml").read_text()
    assert json.loads((out / "summary.json").read_text())["method"] == "knobavg"


# ---------------------------------------------------------------------------------------------- value forms
def echo_app() -> typer.Typer:
    a = typer.Typer()

    @config_command(a)
    def show(config: str = typer.Option(None, "--config"), set_: list[str] = typer.Option([], "--set")):
        typer.echo(json.dumps(run_options(config, set_), default=list))

    return a


def test_value_forms_and_precedence(tmp_path):
    a = echo_app()
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rounds: 9\nclients: 4\nlr: 0.5\nfedavg:\n  server_lr: 3\n")
    r = runner.invoke(
        a,
        [
            "--config",
            str(cfg),
            "--set",
            "clients=5",
            "--set",
            "lr=0.25",
            "--lr",
            "0.125",
            "--target-epsilons",
            "1,2.5",
            "--site-data",
            "a.csv, b.csv",
            "--clip",
            "adaptive:0.5",
            "--keep-nonprivate",
            "--no-nesterov",
            "--method",
            "fedavg",
            "--server-lr",
            "2",
        ],
    )
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    assert got["rounds"] == 9 and got["clients"] == 5 and got["lr"] == 0.125 and got["server_lr"] == 2
    assert got["target_epsilons"] == [1.0, 2.5] and got["site_data"] == ["a.csv", "b.csv"]
    assert got["adaptive_clip"] is True and got["clip"] == 0.5
    assert got["report_nonprivate"] is False and got["nesterov"] is False
    assert "noise_multiplier" not in got and "dml_alpha" not in got  # only what was given
    r = runner.invoke(a, ["--clip", "wide"])
    assert r.exit_code == 2 and "--clip takes a number, 'adaptive' or 'adaptive:C0'" in r.output
    r = runner.invoke(a, ["--target-epsilons", "1,x"])
    assert r.exit_code == 2 and "comma-separated numbers" in r.output and "Traceback" not in r.output


def test_generated_choices_are_click_choices_that_complete_and_leave_refusal_to_the_config():
    """--method, --dataset, … are click.Choice s of their registries (help and shell completion); a value
    outside them reaches the config, which refuses it in one line (as for recipes and Python)."""
    import click

    from silofl.cli.config_options import RegistryChoice, generated_flags, method_names

    opt = generated_flags()["method"].option()
    assert isinstance(opt.type, RegistryChoice) and isinstance(opt.type, click.Choice)
    assert tuple(opt.type.choices) == method_names()
    done = [c.value for c in opt.type.shell_complete(click.Context(click.Command("x")), opt, "dp-")]
    assert done and all(c.startswith("dp-") for c in done) and "dp-fedavg" in done
    assert opt.type.convert("nope", opt, None) == "nope"  # RunConfig says why, in one line
    assert not isinstance(generated_flags()["private_models"].option().type, click.Choice)  # a list
