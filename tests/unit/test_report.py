"""report.html: written after every run, self-contained, every plot; compare aggregates seeds; headless Chromium
renders it without console errors."""

from __future__ import annotations

import json
import logging
import re
import struct
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_overrides
from tests.browser import browse, chromium, console
from typer.testing import CliRunner

from fedpeft.cli import app
from fedpeft.report import write_report
from fedpeft.resolve import load_config
from fedpeft.report.svg import PALETTE, Series, fmt_bytes, heat_color, heatmap, line_chart, nice_ticks
from fedpeft.runtime.embedded import run_embedded
from fedpeft.tracking.rundir import RunDir

CORE = ("plot-accuracy", "plot-bytes", "plot-acc-vs-bytes", "plot-clients", "plot-loss")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two seeds of one tiny config (3 rounds), and a run with DP (epsilon), ASR and non-participants."""
    root, threads = tmp_path_factory.mktemp("runs"), torch.get_num_threads()
    torch.set_num_threads(1)  # tiny forwards on a shared 2-core machine (see conftest.one_thread)
    try:
        for seed in (0, 1):
            cfg = load_config(None, tiny_overrides(federation__rounds=3, seed=seed))
            run_embedded(cfg, root / "pair" / f"tiny-s{seed}")
        cfg = load_config(None, tiny_overrides(
            federation__num_clients=4, attack__asr=True, federation__non_participants__fraction=0.25,
            method__transforms="[{name: ldp, mechanism: laplace, noise: 0.01}]"))
        run_embedded(cfg, root / "dp")
    finally:
        torch.set_num_threads(threads)
    return root


def _svgs(html: str) -> dict[str, str]:
    return {m.group(1): m.group(0) for m in re.finditer(r'<svg id="([^"]+)".*?</svg>', html, re.S)}


def _self_contained(html: str) -> None:
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert "<script" not in html.lower() and "@import" not in html and "url(http" not in html


def test_every_run_writes_a_self_contained_report_with_every_plot(runs):
    html = (runs / "pair" / "tiny-s0" / "report.html").read_text()
    _self_contained(html)
    svgs = _svgs(html)
    assert set(CORE) <= set(svgs)
    for plot_id, svg in svgs.items():
        tree = ET.fromstring(svg)  # well-formed markup
        assert tree.get("id") == plot_id
        assert svg.count('class="tick"') >= 4 and 'class="label"' in svg and 'class="legend"' in svg
    assert 'id="band-range-accuracy-1"' in svgs["plot-accuracy"]  # local min-max around the local mean
    for table in ('id="comparison"', 'id="summary"', 'id="config"'):
        assert table in html
    assert "federation.rounds" in html and "bytes_up_per_client_round" in html


def test_method_diagnostics_asr_and_participant_roles_are_plotted(runs):
    html = (runs / "dp" / "report.html").read_text()
    svgs = _svgs(html)
    server = RunDir(runs / "dp").read_metrics()[-1]["server"]
    assert "epsilon" in server
    for key in server:
        assert f"plot-server-{key}" in svgs
    assert "plot-asr" in svgs
    assert "local P" in svgs["plot-accuracy"] and "local NP" in svgs["plot-accuracy"]


def test_compare_aggregates_seeds_into_a_band_and_a_table(runs, tmp_path):
    out = tmp_path / "cmp.html"
    res = CliRunner().invoke(app, ["compare", str(runs / "pair" / "tiny-s0"), str(runs / "pair" / "tiny-s1"),
                                   str(runs / "dp"), "--out", str(out), "--target", "0"])
    assert res.exit_code == 0, res.output
    html = out.read_text()
    _self_contained(html)
    svgs = _svgs(html)
    assert set(CORE) <= set(svgs) and "plot-server-epsilon" in svgs and "plot-asr" in svgs
    assert 'id="band-std-accuracy-0"' in svgs["plot-accuracy"]  # the two seeds: mean ± std
    assert "tiny (n=2, seeds 0,1)" in html
    # bytes up to reach accuracy 0: the first round's upload, the same for both seeds
    first = RunDir(runs / "pair" / "tiny-s0").read_metrics()[0]["bytes_up"]
    row = re.search(r"<tr><th>tiny \(n=2.*?</tr>", html, re.S).group(0)
    assert f"{fmt_bytes(first)} ± 0 B" in row


def test_report_of_a_folder_of_runs_and_default_target(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["report", str(runs / "pair")])
    assert res.exit_code == 0, res.output
    html = (tmp_path / "report.html").read_text()
    finals = [RunDir(runs / "pair" / f"tiny-s{s}").read_metrics()[-1]["accuracy"] for s in (0, 1)]
    assert f"bytes up to reach {0.95 * max(finals):.4f}" in html
    assert CliRunner().invoke(app, ["report", str(tmp_path / "missing")]).exit_code == 2


def test_report_flag_off_and_render_failures_only_warn(tiny_cfg, tmp_path, monkeypatch, caplog, one_thread):
    run_embedded(tiny_cfg(federation__rounds=1, evaluation__report=False), tmp_path / "off")
    assert not (tmp_path / "off" / "report.html").exists()

    def broken(*args, **kwargs):
        raise RuntimeError("renderer exploded")

    monkeypatch.setattr("fedpeft.report.write_report", broken)
    with caplog.at_level(logging.WARNING, logger="fedpeft"):
        summary = run_embedded(tiny_cfg(federation__rounds=1), tmp_path / "broken")
    assert summary["rounds"] == 1 and (tmp_path / "broken" / "summary.json").exists()
    assert "renderer exploded" in caplog.text and not (tmp_path / "broken" / "report.html").exists()


def test_report_flag_changes_no_resume_check(tiny_cfg, tmp_path, one_thread):
    run_embedded(tiny_cfg(federation__rounds=1), tmp_path / "run")
    # an older config.yaml without the key (written before it existed) still resumes
    path = tmp_path / "run" / "config.yaml"
    path.write_text(path.read_text().replace("  report: true\n", ""))
    summary = run_embedded(tiny_cfg(federation__rounds=1, evaluation__report=False), tmp_path / "run", resume=True)
    assert summary["rounds"] == 1


def test_an_unfinished_run_with_gaps_still_renders(tmp_path):
    """No summary.json yet, rounds without evaluation (None), NaN loss, no local evaluation, no server keys."""
    run = RunDir(tmp_path / "r")
    run.write_config("seed: 3\nmethod: {name: fedbpt}\n")
    for rnd, acc in ((1, None), (2, 0.5), (3, None)):
        run.append_metrics({"round": rnd, "accuracy": acc, "loss": float("nan"), "bytes_up": 10 ** rnd,
                            "bytes_down": 5, "train_loss": None, "local_accuracy": {}, "server": {"sigma": 0.1 * rnd},
                            "wall_seconds": 1.0})
    html = write_report(tmp_path / "r").read_text()
    svgs = _svgs(html)
    assert set(CORE) | {"plot-server-sigma"} <= set(svgs)
    assert "no data" in svgs["plot-clients"] and "no data" in svgs["plot-loss"]
    assert "no summary.json" in html and "fedbpt" in html
    for svg in svgs.values():
        ET.fromstring(svg)


def test_svg_axes_ticks_and_empty_data():
    assert nice_ticks(0.13, 0.92) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    svg = line_chart("plot-x", "t", "round", "y", [Series("a", [1, 2, 3], [1e3, 1e5, 1e7])], ylog=True, xint=True)
    ET.fromstring(svg)
    assert ">10,000<" in svg and ">1e+09<" not in svg and ">1,000,000<" in svg
    empty = line_chart("plot-y", "t", "x", "y", [Series("a", [], [])])
    assert 'id="plot-y"' in empty and "no data" in empty


# ---------------------------------------------------------------- per-round vectors (heatmaps)

def _vector_run(path: Path, **over) -> list[dict]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_embedded(load_config(None, tiny_overrides(task__num_examples=96, **over)), path)
    finally:
        torch.set_num_threads(threads)
    return RunDir(path).read_metrics()


def _heatmap_cells(svg: str, key: str) -> list[ET.Element]:
    tree = ET.fromstring(svg)
    assert tree.get("id") == f"plot-heatmap-{key}" and 'class="label"' in svg and svg.count('class="tick"') >= 4
    (cells,) = [g for g in tree.iter("g") if g.get("id") == f"cells-heatmap-{key}"]
    return list(cells)


def test_head_pruning_importance_is_a_heatmap_of_rounds_by_heads(tmp_path):
    recs = _vector_run(tmp_path / "hp", method__name="headprune", method__adapter__num_tokens=None,
                       method__adapter__r=4, method__sharing__sparsity=0.5)
    for rec in recs:
        vec = rec["server_vectors"]
        assert set(vec) == {"head_importance", "head_kept"}
        assert len(vec["head_importance"]) == len(vec["head_kept"]) and min(vec["head_importance"]) >= 0
        ok = [c for c in rec["clients"] if c["status"] == "ok"]
        assert sum(vec["head_kept"]) == sum(c["kept_heads"] for c in ok) and max(vec["head_kept"]) <= len(ok)
        assert all((a > 0) == (k > 0) for a, k in zip(vec["head_importance"], vec["head_kept"]))
    html = (tmp_path / "hp" / "report.html").read_text()
    _self_contained(html)
    svgs = _svgs(html)
    assert {"plot-heatmap-head_importance", "plot-heatmap-head_kept"} <= set(svgs)
    cells = _heatmap_cells(svgs["plot-heatmap-head_importance"], "head_importance")
    assert len(cells) == len(recs) * len(recs[0]["server_vectors"]["head_importance"])
    assert "plot-server-head_importance" not in svgs  # vectors are not line plots


def test_fedpeptao_layer_scores_and_selected_layers_are_heatmaps(tmp_path):
    recs = _vector_run(tmp_path / "pep", method__name="fedpeptao", method__adapter__num_tokens=2,
                       method__sharing__warmup_rounds=1, federation__rounds=2)
    for rec in recs:  # selection in round 1 (the warm-up's last round), kept afterwards
        vec = rec["server_vectors"]
        assert set(vec) == {"layer_scores", "selected_layers"}
        assert set(vec["selected_layers"]) <= {0.0, 1.0} and 1.0 in vec["selected_layers"]
        assert len(vec["layer_scores"]) == len(vec["selected_layers"])
    html = (tmp_path / "pep" / "report.html").read_text()
    svgs = _svgs(html)
    assert {"plot-heatmap-selected_layers", "plot-heatmap-layer_scores"} <= set(svgs)
    cells = _heatmap_cells(svgs["plot-heatmap-selected_layers"], "selected_layers")
    assert len(cells) == 2 * len(recs[0]["server_vectors"]["selected_layers"])
    assert {c.get("fill") for c in cells} <= {heat_color(0), heat_color(1)}


def test_runs_without_vectors_have_no_heatmaps_and_no_field(runs):
    assert all("server_vectors" not in rec for rec in RunDir(runs / "pair" / "tiny-s0").read_metrics())
    assert "plot-heatmap-" not in (runs / "pair" / "tiny-s0" / "report.html").read_text()


def test_heatmap_svg_scale_gaps_and_empty_data():
    svg = heatmap("plot-heatmap-x", "t", "head", "round", [("1", [0.0, 0.5, 1.0]), ("2", [None, 2.0, 1.0])])
    ET.fromstring(svg)
    assert f'fill="{heat_color(1)}"' in svg and f'fill="{heat_color(0)}"' in svg  # the largest, the smallest
    assert svg.count('fill="#ddd"') == 1  # the gap
    assert ">round 2, head 1: 2<" in svg.replace("<title>", ">") and ">2<" in svg  # hover value, colour-bar max
    assert "no data" in heatmap("plot-heatmap-y", "t", "x", "y", [])
    assert "no data" in heatmap("plot-heatmap-z", "t", "x", "y", [("1", [None])])


def _hand_run(path: Path, rounds: int, vectors=None, summary: dict | None = None, seed: int = 0,
              method: str = "headprune") -> Path:
    """A run directory written by hand: records for rounds 0..rounds (round 0: the initial evaluation)."""
    run = RunDir(path)
    run.write_config(f"seed: {seed}\nmethod: {{name: {method}}}\n")
    for rnd in range(rounds + 1):
        run.append_metrics({"round": rnd, "accuracy": 0.5 + 0.1 * rnd, "loss": 1.0, "bytes_up": 10 * rnd,
                            "bytes_down": 5, "local_accuracy": {}, "wall_seconds": 1.0,
                            **({"server_vectors": vectors(rnd)} if vectors else {})})
    if summary is not None:
        run.write_summary(summary)
    return path


def _comparison_rows(html: str) -> list[list[str]]:
    table = ET.fromstring(re.search(r'<table id="comparison">.*?</table>', html, re.S).group(0))
    return [["".join(c.itertext()) for c in tr] for tr in table]


def test_comparison_rounds_are_training_rounds_not_round_zero(tmp_path):
    """Round 0 (the initial evaluation) is no training round: a 2-round run shows 2, as summary.json says."""
    _hand_run(tmp_path / "done", 2, summary={"rounds": 2, "final_accuracy": 0.7})
    _hand_run(tmp_path / "unfinished", 2)  # no summary.json: the records past round 0
    for name in ("done", "unfinished"):
        header, row = _comparison_rows(write_report(tmp_path / name).read_text())
        assert row[header.index("rounds")] == "2"
    _hand_run(tmp_path / "odd", 3, summary={"rounds": 5})  # the summary's count wins where there is one
    header, row = _comparison_rows(write_report(tmp_path / "odd").read_text())
    assert row[header.index("rounds")] == "5"


def test_comparison_best_accuracy_leaves_out_round_zero(tmp_path):
    """The initial model (round 0) is no result of training: "best accuracy" is summary.json's, else the best
    training round's, even where round 0 scored higher."""
    run = _hand_run(tmp_path / "r", 2)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    first = json.loads(lines[0]) | {"accuracy": 0.9}
    (run / "metrics.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    header, row = _comparison_rows(write_report(run).read_text())
    assert row[header.index("best accuracy")] == "0.7000"
    RunDir(run).write_summary({"rounds": 2, "best_accuracy": 0.65})
    header, row = _comparison_rows(write_report(run).read_text())
    assert row[header.index("best accuracy")] == "0.6500"


def test_heatmaps_only_for_vectors_whose_values_vary(tmp_path):
    """A dense run's head counters are the same everywhere: no heatmap (its colour bar would read 1 / 1 / 1)."""
    def vec(rnd: int) -> dict:
        return {"head_kept": [2, 2, 2, 2], "head_importance": [0.1 * rnd, 0.2, 0.3, 0.0],
                "selected_layers": [1.0, None, float("nan"), 1.0]}  # gaps do not count as variation

    svgs = _svgs(write_report(_hand_run(tmp_path / "dense", 2, vec)).read_text())
    assert "plot-heatmap-head_importance" in svgs
    assert "plot-heatmap-head_kept" not in svgs and "plot-heatmap-selected_layers" not in svgs
    # one rule over all groups together: constant in one configuration, varying in the other -> drawn
    _hand_run(tmp_path / "other", 2, lambda rnd: {"head_kept": [rnd, 2, 2, 2]}, method="fedavg-lora")
    svgs = _svgs(write_report([tmp_path / "dense", tmp_path / "other"], tmp_path / "cmp.html").read_text())
    assert "plot-heatmap-head_kept" in svgs and "plot-heatmap-selected_layers" not in svgs


# ---------------------------------------------------------------- headless Chromium

def png_rows(path: Path) -> tuple[int, int, Iterator[np.ndarray]]:
    """Width, height and the unfiltered pixel rows (lazily, top first) of an 8-bit RGB/RGBA PNG, read with
    zlib (Pillow is not a dependency)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, color = header[:4]
    assert depth == 8 and color in (2, 6) and header[6] == 0, header
    bpp = 3 if color == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, width * bpp + 1)

    def rows() -> Iterator[np.ndarray]:
        prev = np.zeros(width * bpp, np.uint8)
        for f, line in zip(raw[:, 0], raw[:, 1:]):
            if f == 0:
                out = line.copy()
            elif f == 1:
                out = (line.reshape(width, bpp).astype(np.int64).cumsum(0) % 256).astype(np.uint8).ravel()
            elif f == 2:
                out = line + prev
            else:  # average (3) and Paeth (4) depend on the byte to the left: one by one
                cur, up = [0] * (width * bpp), prev.tolist()
                for i, x in enumerate(line.tolist()):
                    a = cur[i - bpp] if i >= bpp else 0
                    b = up[i]
                    if f == 3:
                        cur[i] = (x + (a + b) // 2) & 0xFF
                        continue
                    c = up[i - bpp] if i >= bpp else 0
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    cur[i] = (x + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
                out = np.array(cur, np.uint8)
            yield out.reshape(width, bpp)[:, :3]
            prev = out

    return width, height, rows()


def test_headless_chromium_renders_the_report_without_console_errors(runs, tmp_path):
    binary = chromium()
    control = tmp_path / "control.html"  # the console check must see a page's errors
    control.write_text('<!DOCTYPE html><p>x</p><script>console.error("control-marker")</script>')
    assert any("control-marker" in line for line in console(browse(binary, control, "--dump-dom").stderr))

    page = tmp_path / "cmp.html"
    write_report([runs / "pair" / "tiny-s0", runs / "pair" / "tiny-s1", runs / "dp"], page)
    dom = browse(binary, page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert console(dom.stderr) == []
    for plot_id in CORE + ("plot-asr", "plot-server-epsilon"):
        assert f'id="{plot_id}"' in dom.stdout

    shot = tmp_path / "shot.png"  # the report the run wrote itself
    res = browse(binary, runs / "pair" / "tiny-s0" / "report.html", f"--screenshot={shot}")
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    assert console(res.stderr) == []
    width, height, rows = png_rows(shot)
    assert (width, height) == (1200, 2000)
    colors: set[bytes] = set()
    blue = bytes.fromhex(PALETTE[0][1:])  # the first line of the accuracy plot
    for row in rows:  # far from blank: text, tables and the plots' lines (stop reading once seen)
        colors.update(map(bytes, row[::3]))
        if len(colors) > 20 and blue in colors:
            break
    assert len(colors) > 20 and blue in colors, len(colors)
