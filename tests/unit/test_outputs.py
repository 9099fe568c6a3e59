"""Every output location is checked before any work, and an impossible one is a single line naming the path
(issue 35, defect 2): ``run --out``, ``report --out``, ``export OUT``, ``predict --out``, ``evaluate --out``."""

from __future__ import annotations

import tempfile

import pytest
from conftest import tiny_overrides
from typer.testing import CliRunner

from fedpeft.cli import app
from fedpeft.outputs import OutputError, check_output_dir, check_output_file
from fedpeft.resolve import load_config
from fedpeft.runtime.embedded import run_embedded

runner = CliRunner()


def one_line_error(res, *names: str) -> None:
    assert res.exit_code == 2, res.output
    text = res.output.strip()
    assert text.startswith("error:") and "Traceback" not in text and len(text.splitlines()) <= 3  # one wrapped line
    for name in names:
        assert name in " ".join(text.split())


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("out") / "run"
    run_embedded(load_config(None, tiny_overrides(federation__rounds=1)), run_dir)
    return run_dir


def test_paths_under_a_file_are_refused(tmp_path):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("x")
    with pytest.raises(OutputError, match=r"--out: cannot write .*notes.txt/run: .*notes.txt is a file, so nothing"):
        check_output_dir(blocker / "run", "--out")
    with pytest.raises(OutputError, match=r"is a file, not a folder"):
        check_output_dir(blocker, "--out")
    with pytest.raises(OutputError, match=r"--out: cannot write .*notes.txt/a/b.csv"):
        check_output_file(blocker / "a" / "b.csv", "--out")
    with pytest.raises(OutputError, match=r"it is a folder"):
        check_output_file(tmp_path, "--out")
    assert check_output_dir(tmp_path / "new" / "deeper", "--out") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # checking creates nothing


def test_an_unwritable_folder_is_refused_by_probing_it(tmp_path, monkeypatch):
    """A read-only mount or missing permission (root passes permission bits, so the probe is what tells)."""
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(OutputError, match=rf"--out: cannot write {tmp_path}/run: {tmp_path} is not writable "
                                          r"\(Read-only file system\)"):
        check_output_dir(tmp_path / "run", "--out")


def test_run_checks_out_before_loading_anything(tmp_path, monkeypatch):
    import fedpeft.runtime.embedded as embedded

    monkeypatch.setattr(embedded, "build", lambda *a, **k: pytest.fail("built a model before checking --out"))
    (tmp_path / "f").write_text("x")
    sets = [a for item in tiny_overrides(federation__rounds=1) for a in ("--set", item)]
    one_line_error(runner.invoke(app, ["run", "--out", str(tmp_path / "f" / "run"), *sets]), str(tmp_path / "f"))


@pytest.mark.parametrize("command", ["report", "export", "predict", "evaluate"])
def test_commands_check_their_output_before_any_work(command, finished_run, tmp_path, monkeypatch):
    import fedpeft.predict
    import fedpeft.report

    monkeypatch.setattr(fedpeft.predict, "open_model", lambda *a, **k: pytest.fail("loaded a model first"))
    monkeypatch.setattr(fedpeft.report, "write_report", lambda *a, **k: pytest.fail("rendered first"))
    (tmp_path / "f").write_text("x")
    (tmp_path / "in.csv").write_text("text,label\nhello,positive\n")
    bad = tmp_path / "f" / ("peft" if command == "export" else "out.csv" if command != "report" else "r.html")
    args = {"report": ["report", str(finished_run), "--out", str(bad)],
            "export": ["export", str(finished_run), str(bad)],
            "predict": ["predict", str(finished_run), "--text", "hello", "--out", str(bad)],
            "evaluate": ["evaluate", str(finished_run), "--file", str(tmp_path / "in.csv"), "--out", str(bad)]}[command]
    one_line_error(runner.invoke(app, args), str(tmp_path / "f"), "is a file")


def test_an_os_error_during_a_run_is_one_line_naming_the_path(tmp_path, monkeypatch):
    import fedpeft.runtime.registry as registry

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / "run" / "metrics.jsonl"))

    monkeypatch.setattr(registry, "runtime", lambda name: disk_full)
    sets = [a for item in tiny_overrides(federation__rounds=1) for a in ("--set", item)]
    one_line_error(runner.invoke(app, ["run", "--out", str(tmp_path / "run"), *sets]),
                   f"{tmp_path / 'run' / 'metrics.jsonl'}: No space left on device")
