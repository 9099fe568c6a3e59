"""The command line as a user runs it, including a real SIGKILL in the middle of a run and --resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fedpeft.cli import app
from fedpeft.tracking.rundir import RunDir

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


def test_flower_superlink_checks_who_may_submit_before_it_starts(monkeypatch):
    import fedpeft.cli.flower as flower_cli

    started = []
    monkeypatch.setattr(flower_cli, "_exec", started.append)
    runner = CliRunner()
    res = runner.invoke(app, ["flower", "superlink", "--insecure", "--control-from", "10.0.0.0/33"])
    assert res.exit_code == 2 and "--control-from: '10.0.0.0/33'" in res.output
    res = runner.invoke(app, ["flower", "superlink", "--insecure", "--control-from", "10.0.0.0/8",
                              "--i-understand-anyone-can-submit"])
    assert res.exit_code == 2 and "exclude each other" in res.output and not started
    res = runner.invoke(app, ["flower", "superlink", "--insecure", "--host", "0.0.0.0",
                              "--control-from", "10.0.4.0/24"])
    assert res.exit_code == 0 and started[-1][3:5] == ["--control-from", "127.0.0.0/8,::1/128,10.0.4.0/24"]
    res = runner.invoke(app, ["flower", "superlink", "--insecure", "--i-understand-anyone-can-submit"])
    assert res.exit_code == 0 and started[-1][4] == "any" and "anyone who can connect" in res.output


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


# ---------------------------------------------------------------- what a newcomer checks first (issue 35)


def test_dry_run_shows_classes_clients_and_one_example_as_the_model_sees_it(tmp_path):
    res = runner.invoke(app, ["run", "--dry-run", *_sets(task__name="synthetic-topic")])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "classes found" in out and "clients:" in out
    from fedpeft.experiment import build_experiment
    from fedpeft.resolve import load_config

    exp = build_experiment(load_config(None, tiny_overrides(task__name="synthetic-topic")))
    for name in exp.task.class_names:
        assert name in out
    for line in exp.describe_clients():  # per client: sizes and training labels by class name
        assert line in out
    assert "⟨4 adapter rows⟩" in out and "[CLS]" in out  # the soft prompt's rows after [CLS], then the text


def test_switching_the_preset_warns_about_the_files_sections_and_the_summary_says_what_ran(tmp_path):
    cfg = tmp_path / "hp.yaml"
    cfg.write_text("method:\n  name: headprune\n  adapter: {name: lora, r: 4}\n"
                   "  sharing: {name: head_pruning, sparsity: 0.5}\n  aggregator: {name: head_weighted}\n")
    sets = _sets(method__adapter__num_tokens=None, federation__rounds=1, task__num_examples=72)
    res = runner.invoke(app, ["run", str(cfg), "--out", str(tmp_path / "r"), "--set", "method.name=fedavg-lora",
                              *sets])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "warning: method.name 'fedavg-lora': the config file's own method sections still apply" in out
    assert "method.aggregator head_weighted instead of the preset's fedavg" in out
    assert "sparsity=0.5" in out and "delete them from the file" in out
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["method"] == "fedavg-lora"
    assert summary["method_resolved"]["aggregator"] == "head_weighted"
    assert {"aggregator", "sharing"} <= set(summary["preset_overrides"])


def test_quiet_means_quiet(tmp_path):
    cmd = [sys.executable, "-m", "fedpeft.cli", "run", "--quiet", "--out", str(tmp_path / "r"),
           *_sets(federation__rounds=1)]
    env = os.environ | {"PYTHONPATH": str(Path("tests").resolve())}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    assert done.stderr.strip() == "", done.stderr  # no INFO lines, no loading bars, no library notices
    assert "final accuracy" in done.stdout and "report:" in done.stdout


def test_a_mistyped_model_name_offline_fails_at_once_with_the_names_it_knows(tmp_path, monkeypatch):
    import socket

    import transformers

    def no_network(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained",
                        lambda *a, **k: pytest.fail("asked the hub (retries) for a typo"))
    res = runner.invoke(app, ["run", "--out", str(tmp_path / "r"), *_sets(model__name="tiny-bertt")])
    assert res.exit_code == 2
    out = " ".join(res.output.split())
    assert "model.name: 'tiny-bertt' is not a built-in model (did you mean 'tiny-bert'" in out
    assert "hub is not reachable" in out


def test_an_option_the_readout_ignores_warns_naming_it(caplog):
    from fedpeft.experiment import build_experiment
    from fedpeft.resolve import load_config

    with caplog.at_level("WARNING", logger="fedpeft"):
        build_experiment(load_config(None, tiny_overrides(task__label_words="[bad, good]")))
    assert "task.label_words is set, but the similarity readout" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="fedpeft"):
        build_experiment(load_config(None, tiny_overrides(model__readout="verbalizer", model__name="tiny-llama",
                                                          task__label_words="[bad, good]")))
    assert "label_words" not in caplog.text


def test_components_name_prints_its_settings_and_an_unknown_name_fails():
    res = runner.invoke(app, ["components", "fedadam"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "method.aggregator: fedadam" in res.output
    for key, default in (("eta", "0.1"), ("beta_1", "0.9"), ("tau", "0.001")):
        assert any(key in line and default in line for line in res.output.splitlines()), key
    res = runner.invoke(app, ["components", "fedadm"])
    assert res.exit_code == 2 and "no component 'fedadm'" in res.output


def test_config_prints_the_resolved_config_and_its_schema_checks_configs():
    jsonschema = pytest.importorskip("jsonschema")
    res = runner.invoke(app, ["config", "--set", "method.name=fedbpt"])
    assert res.exit_code == 0, res.output
    resolved = yaml.safe_load(res.output)
    assert resolved["method"]["trainer"]["name"] == "cmaes"
    res = runner.invoke(app, ["config", "--schema"])
    assert res.exit_code == 0
    schema = json.loads(res.output)
    jsonschema.validate(resolved, schema)  # a resolved config is valid, every component's keys included
    for bad in ({"method": {"aggregator": {"name": "fedadam", "eta": "fast"}}},
                {"method": {"aggregator": {"name": "fedadm"}}}, {"tracking": [{"name": "mlflow", "uri": "x"}]},
                {"federation": {"num_clients": 0}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_a_local_only_run_says_its_global_adapter_was_never_trained(tmp_path):
    """Local-only keeps every trained tensor on the clients: the console, summary.json and compare label the global
    adapter untrained and lead with the clients' own accuracy, never the initial model's as the method's."""
    sets = _sets(method__name="local-only", method__adapter__num_tokens=None, method__adapter__name="lora",
                 method__adapter__r=2, federation__rounds=1, task__num_examples=72)
    res = runner.invoke(app, ["run", "--out", str(tmp_path / "r"), *sets])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["global_adapter"] == "untrained" and summary["untrained_global"]
    out = " ".join(res.output.split())
    assert "the global adapter was never trained" in out and "final accuracy" not in out
    res = runner.invoke(app, ["compare", str(tmp_path / "r"), "--out", str(tmp_path / "c.html")])
    assert res.exit_code == 0 and "global adapter never trained" in (tmp_path / "c.html").read_text()
    fed = _sets(federation__rounds=1, task__num_examples=72)
    runner.invoke(app, ["run", "--out", str(tmp_path / "f"), *fed])
    assert json.loads((tmp_path / "f" / "summary.json").read_text())["global_adapter"] == "trained"
