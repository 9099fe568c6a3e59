"""The command line as a user runs it, including a real SIGKILL in the middle of a run and --resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from fedpeft.cli import app
from fedpeft.tracking.rundir import RunDir
from fedpeft.tracking.summary import TIMING_FIELDS

from conftest import tiny_overrides

runner = CliRunner()


def _sets(**extra) -> list[str]:
    out = []
    for item in tiny_overrides(**extra):
        out += ["--set", item]
    return out


def test_methods_and_tasks_are_listed():
    res = runner.invoke(app, ["methods"])
    assert res.exit_code == 0 and "fedprompt" in res.output and "fedavg-full" in res.output
    res = runner.invoke(app, ["tasks"])
    assert res.exit_code == 0 and "bbc" in res.output and "sst2" in res.output and "hf:" in res.output


def test_run_with_set_and_out(tmp_path):
    res = runner.invoke(app, ["run", "--out", str(tmp_path / "r"), *_sets(federation__rounds=2)])
    assert res.exit_code == 0, res.output
    assert "final accuracy" in res.output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["method"] == "fedprompt"


def test_config_error_names_the_field_and_exits_2(tmp_path):
    res = runner.invoke(app, ["run", "--out", str(tmp_path / "r"), "--set", "federation.partition.alpha=-2"])
    assert res.exit_code == 2
    assert "federation.partition.alpha" in res.output
    assert not (tmp_path / "r").exists()


def test_example_configs_resolve():
    from fedpeft.resolve import load_config

    for path in Path("examples").glob("*.yaml"):
        load_config(path)


def _strip(records):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]


def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    sets = _sets(federation__rounds=12)
    cmd = [sys.executable, "-m", "fedpeft.cli", "run", "--quiet", *sets]
    env = os.environ | {"PYTHONPATH": str(Path("tests").resolve())}
    subprocess.run(cmd + ["--out", str(tmp_path / "full")], check=True, env=env, capture_output=True)

    cut = tmp_path / "cut"
    proc = subprocess.Popen(cmd + ["--out", str(cut)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and len(RunDir(cut).read_metrics()) < 3:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    done = len(RunDir(cut).read_metrics())
    assert 3 <= done < 12, f"kill landed after {done} rounds"
    assert not (cut / "summary.json").exists()
    subprocess.run(cmd + ["--out", str(cut), "--resume"], check=True, env=env, capture_output=True)
    assert _strip(RunDir(cut).read_metrics()) == _strip(RunDir(tmp_path / "full").read_metrics())


def test_flower_commands_need_tls_or_an_explicit_insecure(tmp_path):
    runner = CliRunner()
    for args in (["flower", "superlink"], ["flower", "supernode", "--superlink", "a:1", "--partitions", "0",
                                           "--state-dir", str(tmp_path)],
                 ["flower", "run", "--out", str(tmp_path / "r")], ["flower", "register", str(tmp_path / "k.pub")]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and "--insecure" in res.output, (args, res.output)
    res = runner.invoke(app, ["flower", "superlink", "--ssl-certfile", str(tmp_path / "x.pem")])
    assert res.exit_code == 2 and "needs all of" in res.output
    res = runner.invoke(app, ["flower", "supernode", "--superlink", "a:1", "--partitions", "0", "--state-dir",
                              str(tmp_path), "--root-certificates", str(tmp_path / "missing.crt")])
    assert res.exit_code == 2 and "no such file" in res.output


def test_flower_certs_and_node_keys_load_as_flower_loads_them(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

    assert CliRunner().invoke(app, ["flower", "certs", "--out", str(tmp_path), "--host", "10.0.0.5",
                                    "--host", "link.example"]).exit_code == 0
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((tmp_path / "server.pem").read_bytes())
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(v) for v in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]
    assert sans.get_values_for_type(x509.DNSName) == ["link.example"]
    assert (tmp_path / "server.key").stat().st_mode & 0o077 == 0
    assert CliRunner().invoke(app, ["flower", "node-key", "--out", str(tmp_path), "--name", "n0"]).exit_code == 0
    private = load_ssh_private_key((tmp_path / "n0").read_bytes(), None)
    public = load_ssh_public_key((tmp_path / "n0.pub").read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
    assert private.public_key().public_numbers() == public.public_numbers()
