"""Generation (instruction-tuning) tasks in the data layer: file tasks with a response column, WebNLG and Dolly,
their errors, sampling, by_column partitions with unseen test categories, and fingerprints."""

from __future__ import annotations

import csv
import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedpeft.config import ConfigError, ExperimentConfig, TaskConfig
from fedpeft.data import OTHER_GROUP, load_task, shared_data_dir, split_by_group
from fedpeft.data.fingerprint import examples_sha256
from fedpeft.data.partition import group_partition, pool_small_groups, unseen_groups
from fedpeft.data.types import Example, TaskData


def write(path: Path, rows: list[dict]) -> Path:
    """``rows`` as csv, tsv, jsonl or parquet by the file's extension (csv/tsv: lists as JSON array strings)."""
    fmt = path.suffix[1:]
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif fmt == "parquet":
        pd.DataFrame(rows).to_parquet(path)
    else:
        flat = [{k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()} for r in rows]
        if fmt == "tsv":  # no quoting: one row per line, fields split at tabs
            lines = ["\t".join(flat[0])] + ["\t".join(str(v) for v in r.values()) for r in flat]
            path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            return path
        with path.open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(flat[0]))
            w.writeheader()
            w.writerows(flat)
    return path


def gen_rows(n: int, offset: int = 0) -> list[dict]:
    """Instruction rows, every third without input, two references each, from one of two categories."""
    return [{"instruction": f"Summarise item {i}", "context": "" if i % 3 == 0 else f"item {i} is blue",
             "answer": f"Item {i} is blue.", "refs": [f"Item {i} is blue.", f"It is blue ({i})."],
             "cat": "x" if i % 2 else "y"} for i in range(offset, offset + n)]


def gen_cfg(path: Path, **kw: object) -> TaskConfig:
    base: dict[str, object] = {"name": path.suffix[1:] or "jsonl", "path": str(path), "input_column": "context",
                               "response_column": "answer"}
    return TaskConfig(**(base | kw))


def shared_folder(name: str) -> Path:
    """The benchmark folder ``name``, or skip the test."""
    base = shared_data_dir()
    if base is None or not (base / name).is_dir():
        pytest.skip(f"benchmark folder shared/data/{name} not found (set FEDPEFT_DATA_DIR to enable)")
    return base / name


# ---------------------------------------------------------------- records


def test_refs_fall_back_to_the_target() -> None:
    assert Example("do", 0, target="done").refs == ("done",)
    assert Example("do", 0, target="done", references=("a", "b")).refs == ("a", "b")
    assert Example("text", 1).refs == ()


def test_from_spec_reads_specs_written_before_generation_tasks() -> None:
    old = {"name": "sst2", "class_names": ["negative", "positive"], "label_words": ["bad", "great"],
           "label_descriptions": ["a", "b"], "template": "{text_a} It was {mask}.", "causal_template": "{text_a}",
           "is_pair": False}
    task = TaskData.from_spec(old)
    assert task.kind == "classification" and not task.is_generation and task.prompt_template is None
    gen = TaskData("webnlg", [], [], [], [], [], kind="generation", prompt_template="{instruction}\n{input}")
    back = TaskData.from_spec(json.loads(json.dumps(gen.spec())))
    assert back.is_generation and back.prompt_template == "{instruction}\n{input}" and back.num_classes == 0


# ---------------------------------------------------------------- file tasks


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tsv", "parquet"])
def test_each_format_reads_generation_rows(tmp_path: Path, fmt: str) -> None:
    write(tmp_path / f"train.{fmt}", gen_rows(12))
    write(tmp_path / f"test.{fmt}", gen_rows(4, offset=100))
    data = load_task(gen_cfg(tmp_path, name=fmt, references_column="refs"), 0, group_column="cat")
    assert data.is_generation and data.kind == "generation" and data.num_classes == 0
    assert data.class_names == data.label_words == data.label_descriptions == []
    assert len(data.train) == 12 and len(data.test) == 4
    e = data.train[1]
    assert (e.text_a, e.text_b, e.target, e.label, e.group) == ("Summarise item 1", "item 1 is blue", "Item 1 is blue.",
                                                                0, "x")
    assert e.references == ("Item 1 is blue.", "It is blue (1).") == e.refs
    assert data.train[0].text_b is None  # an empty input is no input
    assert data.test[0].text_a == "Summarise item 100" and data.test[0].group == "y"
    assert data.files == [str((tmp_path / f"train.{fmt}").absolute()), str((tmp_path / f"test.{fmt}").absolute())]


def test_response_column_alone_makes_a_generation_task_without_input_or_references(tmp_path: Path) -> None:
    path = write(tmp_path / "data.jsonl", gen_rows(10))
    data = load_task(TaskConfig(name="jsonl", path=str(path), response_column="answer", test_fraction=0.3), 0)
    assert data.is_generation and len(data.train) == 7 and len(data.test) == 3
    assert all(e.text_b is None and e.references == () and e.refs == (e.target,) for e in data.train + data.test)
    again = load_task(TaskConfig(name="jsonl", path=str(path), response_column="answer", test_fraction=0.3), 5)
    assert again.test == data.test  # the split is seeded by SPLIT_SEED, not the experiment seed
    assert sorted(e.text_a for e in data.train + data.test) == sorted(r["instruction"] for r in gen_rows(10))


def test_references_as_one_plain_string_count_as_one(tmp_path: Path) -> None:
    rows = gen_rows(6)
    for r in rows:
        r["refs"] = "Only this one."
    write(tmp_path / "train.csv", rows)
    data = load_task(gen_cfg(tmp_path, name="csv", references_column="refs"), 0)
    assert {e.references for e in data.train + data.test} == {("Only this one.",)}


def test_prompt_template_and_max_train_apply_to_file_generation_tasks(tmp_path: Path) -> None:
    path = write(tmp_path / "train.jsonl", gen_rows(40))
    cfg = gen_cfg(path, max_train=10, prompt_template="Task: {instruction}\nInput: {input}")
    a, b = load_task(cfg, 3, group_column="cat"), load_task(cfg, 3, group_column="cat")
    assert a.prompt_template == "Task: {instruction}\nInput: {input}"
    assert len(a.train) == 10 and a.train == b.train  # a file task's cap is global, seeded
    assert load_task(cfg, 4, group_column="cat").train != a.train


@pytest.mark.parametrize(("fmt", "line"), [("jsonl", "line 3"), ("csv", "line 4"), ("parquet", "row 3")])
def test_empty_response_or_instruction_names_key_file_and_line(tmp_path: Path, fmt: str, line: str) -> None:
    for column, key, what in (("answer", "task.response_column", "response"),
                              ("instruction", "task.instruction_column", "instruction")):
        rows = gen_rows(5)
        rows[2][column] = "  "
        path = write(tmp_path / f"data.{fmt}", rows)
        with pytest.raises(ConfigError, match=rf"{key}: .*data\.{fmt} {line}: empty {what} in column '{column}'"):
            load_task(gen_cfg(path), 0)


def test_a_row_without_the_response_key_is_named_as_missing_not_empty(tmp_path: Path) -> None:
    rows = gen_rows(5)
    del rows[1]["answer"]
    path = write(tmp_path / "data.jsonl", rows)
    with pytest.raises(ConfigError, match=r"task.response_column: .*data\.jsonl line 2 has no response: no value for "
                                          r"'answer' \(a missing key or an empty cell\)"):
        load_task(gen_cfg(path), 0)


def test_a_template_with_an_unknown_field_or_without_the_input_column_is_refused() -> None:
    """``{mr}`` is no field of a template (it would stay literal in every prompt); a template that never uses the
    input column would drop it; ``--set`` takes a template as typed (its braces are no YAML mapping)."""
    from fedpeft.resolve import load_config

    with pytest.raises(ValueError, match=r"unknown field\(s\) \{mr\}: a template fills \{instruction\}"):
        TaskConfig(prompt_template="{instruction} {mr}")
    with pytest.raises(ValueError, match=r"task.input_column 'mr' is set but task.prompt_template 'Q: \{instruction\}' "
                                         r"never uses \{input\}"):
        TaskConfig(prompt_template="Q: {instruction}", input_column="mr")
    assert TaskConfig(prompt_template='{instruction} {input} as {"json": 1}').prompt_template  # literal braces
    cfg = load_config(None, ["task.name=dolly", "task.prompt_template={instruction} | {input}"])
    assert cfg.task.prompt_template == "{instruction} | {input}"
    with pytest.raises(ConfigError, match=r"task.max_lenght: unknown field; did you mean max_length"):
        load_config(None, ["task.max_lenght=20"])


def test_missing_generation_columns_name_the_key_and_list_the_columns(tmp_path: Path) -> None:
    path = write(tmp_path / "data.jsonl", gen_rows(5))
    for kw, key, col in (({"response_column": "output"}, "task.response_column", "output"),
                         ({"instruction_column": "prompt"}, "task.instruction_column", "prompt"),
                         ({"input_column": "ctx"}, "task.input_column", "ctx"),
                         ({"references_column": "texts"}, "task.references_column", "texts")):
        with pytest.raises(ConfigError, match=rf"{key}: column '{col}' not found in .*data\.jsonl; columns found: "
                                              "instruction, context, answer, refs, cat"):
            load_task(gen_cfg(path, **kw), 0)
    with pytest.raises(ConfigError, match="federation.partition.column: column 'site' not found in .*data.jsonl"):
        load_task(gen_cfg(path), 0, group_column="site")


@pytest.mark.parametrize(("value", "message"), [
    (7, "must hold a text or a list of texts, got int"),
    (["fine", 3], "must hold a text or a list of texts, got a list holding int"),
    ({"a": "b"}, "must hold a text or a list of texts, got dict"),
    (["fine", " "], "empty reference in column 'refs'"),
])
def test_bad_references_name_key_file_and_line(tmp_path: Path, value: object, message: str) -> None:
    rows = gen_rows(4)
    rows[1]["refs"] = value
    path = write(tmp_path / "data.jsonl", rows)
    with pytest.raises(ConfigError, match=rf"task.references_column: .*data\.jsonl line 2: .*{message}"):
        load_task(gen_cfg(path, references_column="refs"), 0)


def test_a_broken_json_array_in_csv_references_is_named(tmp_path: Path) -> None:
    rows = gen_rows(4)
    rows[1]["refs"] = '["fine", oops]'  # a string cell that looks like a JSON array but is not one
    path = write(tmp_path / "data.csv", rows)
    with pytest.raises(ConfigError, match=r"task.references_column: .*data\.csv line 3: .*not valid JSON"):
        load_task(gen_cfg(path, references_column="refs"), 0)


def test_empty_group_of_a_generation_row_names_the_partition_column(tmp_path: Path) -> None:
    rows = gen_rows(4)
    rows[3]["cat"] = ""
    path = write(tmp_path / "data.jsonl", rows)
    with pytest.raises(ConfigError, match=r"federation.partition.column: .*data\.jsonl line 4 has no value in "
                                          "column 'cat'"):
        load_task(gen_cfg(path), 0, group_column="cat")


def test_kind_and_keys_of_the_other_kind_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "data.jsonl", gen_rows(6))
    with pytest.raises(ConfigError, match="task.response_column: task.kind is 'generation' but no response column"):
        load_task(TaskConfig(name="jsonl", path=str(path), kind="generation"), 0)
    with pytest.raises(ValueError, match="task.response_column is set, .* task.kind is 'classification'"):
        gen_cfg(path, kind="classification")
    with pytest.raises(ConfigError, match="task.text_column applies to classification file tasks"):
        load_task(gen_cfg(path, text_column="instruction"), 0)
    with pytest.raises(ConfigError, match="task.references_column applies to generation file tasks"):
        load_task(TaskConfig(name="jsonl", path=str(path), references_column="refs"), 0)
    for kw in ({"label_words": ["a", "b"]}, {"label_descriptions": ["a", "b"]}, {"template": "{text_a} {mask}"},
               {"causal_template": "{text_a}:"}):
        with pytest.raises(ConfigError, match=f"task.{next(iter(kw))} applies to classification tasks, not the "
                                              "generation task 'jsonl'"):
            load_task(gen_cfg(path, **kw), 0)
    with pytest.raises(ConfigError, match="task.label_word_spacing applies to a classification task's verbalizer"):
        load_task(gen_cfg(path, label_word_spacing="as_written"), 0)
    with pytest.raises(ConfigError, match="task.few_shot draws k examples per class; the generation task"):
        load_task(gen_cfg(path, few_shot=2), 0)


def test_prompt_template_checks(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"task.prompt_template 'Do \{input\}' lacks \{instruction\}"):
        TaskConfig(prompt_template="Do {input}")
    with pytest.raises(ConfigError, match="task.prompt_template applies to generation tasks, not the classification"):
        load_task(TaskConfig(name="synthetic-sentiment", num_examples=40, prompt_template="{instruction}"), 0)
    with pytest.raises(ConfigError, match="task.kind: task 'synthetic-sentiment' is a classification task"):
        load_task(TaskConfig(name="synthetic-sentiment", num_examples=40, kind="generation"), 0)


def test_max_response_length_must_leave_room_for_the_prompt(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"task.max_response_length \(128\) must be below task.max_length \(128\)"):
        TaskConfig(kind="generation", max_response_length=128)
    path = write(tmp_path / "data.jsonl", gen_rows(6))  # kind auto: only the loader knows it is generation
    with pytest.raises(ConfigError, match=r"task.max_response_length \(200\) must be below task.max_length \(128\)"):
        load_task(gen_cfg(path, max_response_length=200), 0)
    assert load_task(gen_cfg(path, max_response_length=64, max_length=65), 0).is_generation


# ---------------------------------------------------------------- partition: test groups unseen in training


def test_unseen_test_groups_can_stay_apart_from_the_pooled_client() -> None:
    train = np.array(["a", "a", "a", "b", "c", "c", "c"])
    test = np.array(["a", "b", "z", "c", "z"])
    pooled = pool_small_groups(2, train, test)  # classification: unseen values are pooled (unchanged)
    assert pooled[1].tolist() == ["a", OTHER_GROUP, OTHER_GROUP, "c", OTHER_GROUP]
    tr, te = pool_small_groups(2, train, test, pool_unseen=False)
    assert tr.tolist() == pooled[0].tolist() and te.tolist() == ["a", OTHER_GROUP, "z", "c", "z"]
    parts = group_partition(tr, 1, np.random.default_rng(0))
    shards = split_by_group(te, parts, tr, np.random.default_rng(0))
    assert sorted(np.concatenate(shards).tolist()) == [0, 1, 3]  # the unseen 'z' rows are in no shard
    assert unseen_groups(train, test) == ["z"]


# ---------------------------------------------------------------- fingerprints


def _old_examples_sha256(task: TaskData) -> str:
    """The examples' hash as it was computed before generation tasks existed."""
    h = hashlib.sha256(json.dumps(task.class_names).encode())
    for split in (task.train, task.test):
        h.update(b"\x1e")
        for e in split:
            h.update(json.dumps([e.text_a, e.text_b, e.label, e.group], ensure_ascii=False).encode())
    return h.hexdigest()


def test_classification_fingerprints_are_unchanged() -> None:
    for name in ("synthetic-sentiment", "synthetic-pair"):
        task = load_task(TaskConfig(name=name, num_examples=60), 0)
        assert examples_sha256(task) == _old_examples_sha256(task)


def test_fingerprint_covers_responses_and_references(tmp_path: Path) -> None:
    write(tmp_path / "train.jsonl", gen_rows(6))
    write(tmp_path / "test.jsonl", gen_rows(2, offset=50))
    cfg = gen_cfg(tmp_path, references_column="refs")
    base = examples_sha256(load_task(cfg, 0))
    assert examples_sha256(load_task(cfg, 0)) == base
    rows = gen_rows(6)
    rows[4]["answer"] = "Item 4 is red."
    write(tmp_path / "train.jsonl", rows)
    changed = examples_sha256(load_task(cfg, 0))
    rows[4]["answer"], rows[4]["refs"] = "Item 4 is blue.", ["Item 4 is blue."]
    write(tmp_path / "train.jsonl", rows)
    assert len({base, changed, examples_sha256(load_task(cfg, 0))}) == 3


# ---------------------------------------------------------------- built-in tasks on the real data


def test_webnlg_loads_all_categories_with_references() -> None:
    shared_folder("WebNLG")
    data = load_task(TaskConfig(name="webnlg"), 0)
    assert (len(data.train), len(data.test)) == (6940, 1862) and data.is_generation and data.num_classes == 0
    train_cats, test_cats = {e.group for e in data.train}, {e.group for e in data.test}
    assert len(train_cats) == 10 and len(test_cats) == 15
    assert test_cats - train_cats == {"Artist", "Athlete", "CelestialBody", "MeanOfTransportation", "Politician"}
    assert data.info["unseen_categories"] == "Artist,Athlete,CelestialBody,MeanOfTransportation,Politician"
    assert all(e.target and e.references and e.references[0] == e.target and e.text_b for e in data.train)
    assert sum(len(e.refs) for e in data.train) == 18102 and len(data.files) == 2


def test_webnlg_by_column_gives_ten_clients_and_leaves_unseen_test_entries_out() -> None:
    from fedpeft.experiment import split_clients

    shared_folder("WebNLG")
    data = load_task(TaskConfig(name="webnlg"), 0)
    cfg = ExperimentConfig.model_validate({"federation": {"num_clients": 10, "partition": {"scheme": "by_column"}}})
    train, test, groups = split_clients(data, cfg)
    assert len(train) == 10 and groups == sorted({e.group for e in data.train})
    held = np.concatenate(test)
    assert held.size == len(set(held.tolist())) == 971  # the seen test entries, each in one shard
    assert not {data.test[i].group for i in held} & set(unseen_groups([e.group for e in data.train],
                                                                      [e.group for e in data.test]))
    for k, g in enumerate(groups):
        assert {data.test[i].group for i in test[k]} == {g}


def test_webnlg_max_train_and_max_test_cap_each_category() -> None:
    shared_folder("WebNLG")
    data = load_task(TaskConfig(name="webnlg", max_train=50, max_test=20), 0)
    assert set(Counter(e.group for e in data.train).values()) == {50}
    assert set(Counter(e.group for e in data.test).values()) == {20} and len(data.test) == 15 * 20
    assert load_task(TaskConfig(name="webnlg", max_train=50, max_test=20), 0).train == data.train
    assert load_task(TaskConfig(name="webnlg", max_train=50), 1).train != data.train


def test_dolly_splits_by_its_split_column() -> None:
    shared_folder("Dolly")
    data = load_task(TaskConfig(name="dolly"), 0)
    assert (len(data.train), len(data.test)) == (13493, 1518) and data.is_generation
    cats = Counter(e.group for e in data.train)
    assert len(cats) == 8 and cats["open_qa"] == 3355 and {e.group for e in data.test} == set(cats)
    assert all(e.target for e in data.train) and all(e.references == () for e in data.train)
    assert any(e.text_b is None for e in data.train) and any(e.text_b for e in data.train)


def test_builtin_generation_tasks_refuse_file_keys_and_a_conflicting_kind() -> None:
    shared_folder("Dolly")
    with pytest.raises(ConfigError, match="task.response_column applies to the file tasks"):
        load_task(TaskConfig(name="dolly", response_column="output"), 0)
    with pytest.raises(ConfigError, match="task.kind: task 'dolly' is a generation task, not classification"):
        load_task(TaskConfig(name="dolly", kind="classification"), 0)
    data = load_task(TaskConfig(name="dolly", kind="generation", prompt_template="{instruction}\n\n{input}"), 0)
    assert data.prompt_template == "{instruction}\n\n{input}"


def test_missing_generation_data_folder_is_a_clear_error(tmp_path: Path) -> None:
    from fedpeft.data import DataNotFoundError

    with pytest.raises(DataNotFoundError, match="data for task 'webnlg' not found"):
        load_task(TaskConfig(name="webnlg", path=str(tmp_path / "nowhere")), 0)
