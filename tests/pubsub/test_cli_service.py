"""Bad input to the broker-service commands: one line, exit code 2, no traceback (no server needed)."""

from typer.testing import CliRunner

from silofl.cli.main import app

runner = CliRunner()


def said(res, text: str) -> bool:
    return "".join(text.split()) in "".join(res.output.split())


def test_bad_service_input_is_one_line_and_exit_code_2(tmp_path):
    cases = [
        (["pubsub", "serve", "--state", str(tmp_path / "s")], "HTTPS needs --cert and --key"),
        (
            ["pubsub", "serve", "--state", str(tmp_path / "s"), "--cert", "nope.pem", "--key", "nope.key"],
            "no such file",
        ),
        (
            ["pubsub", "serve", "--state", str(tmp_path / "s"), "--insecure-http", "--port", "0"],
            "--port must be",
        ),
        (["pubsub", "list", "--broker", "https://127.0.0.1:9"], "needs --credential"),
        (
            [
                "pubsub",
                "list",
                "--broker",
                "https://127.0.0.1:9",
                "--credential",
                str(tmp_path / "none.json"),
            ],
            "cannot read the credential file",
        ),
        (
            [
                "pubsub",
                "register",
                "--broker",
                "https://127.0.0.1:9",
                "--credential",
                "x",
                "--request",
                str(tmp_path / "none.json"),
                "--out",
                str(tmp_path / "c.json"),
            ],
            "is not a registration request",
        ),
        (
            [
                "pubsub",
                "enroll",
                "--site",
                "a",
                "--site-dir",
                str(tmp_path / "a"),
                "--out",
                str(tmp_path / "r.json"),
            ],
            "no lifetime privacy budget",
        ),
        (["pubsub", "cert", "--out", str(tmp_path / "tls"), "--days", "0"], "--days must be"),
    ]
    for args, why in cases:
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and said(res, why) and "Traceback" not in res.output, (args, res.output)
    (tmp_path / "cred.json").write_text('{"site": "a", "token": "t"}')
    res = runner.invoke(
        app,
        ["pubsub", "list", "--broker", "https://127.0.0.1:9", "--credential", str(tmp_path / "cred.json")],
    )
    assert res.exit_code == 2 and said(res, "cannot reach the broker") and "Traceback" not in res.output, (
        res.output
    )


def test_enroll_writes_a_request_and_keeps_the_key(tmp_path):
    import json

    res = runner.invoke(
        app,
        [
            "pubsub",
            "enroll",
            "--site",
            "a",
            "--site-dir",
            str(tmp_path / "a"),
            "--lifetime-epsilon",
            "3",
            "--out",
            str(tmp_path / "r.json"),
        ],
    )
    assert res.exit_code == 0, res.output
    req = json.loads((tmp_path / "r.json").read_text())
    assert req["site"] == "a" and len(req["public_key"]) == 64 and req["lifetime_epsilon"] == 3.0
    key = (tmp_path / "a" / "keys" / "sign.key").read_text().splitlines()[1]  # the PEM body: the secret
    assert key not in (tmp_path / "r.json").read_text()
    from silofl.site.folder import SiteFolder

    assert (
        req["public_key"] == SiteFolder.load(tmp_path / "a").key_id
    )  # one identity: deployment's card says the same
