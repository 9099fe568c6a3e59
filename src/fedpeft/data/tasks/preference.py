"""Preference tasks: a prompt with a chosen and a rejected response (DPO's data), and the built-in ``hh-rlhf``.

An example is the prompt (``text_a``, the last user turn; ``history``, the dialogue's earlier turns), the chosen
response (``target``) and the rejected one (``rejected``); its ``group`` is the natural client. Dialogues written as
Anthropic's HH-RLHF writes them (``\\n\\nHuman: … \\n\\nAssistant: …``) are split at the last assistant turn
(``split_dialogue``): the text after it is the response, the earlier turns the chat history.

Malformed pairs (``preference_pair``): a dialogue without an assistant turn, or a missing text, is an error naming
the file and line (an empty response is kept: the end token alone); a pair whose chosen and rejected responses are
identical (no preference), whose two dialogues differ before the last assistant turn (no shared prompt), or whose
last assistant turn does not follow a user turn, is skipped, counted and logged, and the counts are kept in the
task's ``info``. A prompt longer than ``task.max_length`` is cut as generation prompts are
(``instruction_encoding``; counted in the run log). LLMBar (``read_llmbar``) is read as a held-out set.

``hh-rlhf`` (``shared/data/HH-RLHF``, see its PROVENANCE.md): the four test splits that are available offline
(8,552 pairs), one client per subset; no train split exists offline, so a fixed seeded ``task.test_fraction`` of
each subset is held out (seed ``SPLIT_SEED``, the same for every run seed) and the rest is the training data.
"""

from __future__ import annotations

import gzip
import json
import logging
from collections import Counter
from pathlib import Path

from fedpeft.config import TaskConfig
from fedpeft.data.tasks.base import SPLIT_SEED, TASKS, data_folder, need_files, plain_split
from fedpeft.data.types import Example, TaskData

log = logging.getLogger(__name__)

HUMAN, ASSISTANT = "\n\nHuman:", "\n\nAssistant:"
HH_SUBSETS = ("harmless-base", "helpful-base", "helpful-online", "helpful-rejection-sampled")
PREFERENCE_TASKS = ("hh-rlhf", "synthetic-preference")  # built-in preference tasks (kind known before loading)


class SkippedPair(ValueError):
    """A pair that carries no preference to learn (identical responses, or no shared prompt): skipped, counted."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def split_dialogue(text: str, where: str) -> tuple[tuple[tuple[str, str], ...], str, str]:
    """(earlier turns as (role, text), the last user turn, the last assistant turn) of an HH-RLHF dialogue;
    ValueError naming ``where`` if it has no assistant turn; ``SkippedPair`` if the turn before the last assistant
    turn is not a user turn (HH-RLHF has a few dialogues whose markers lost their line breaks)."""
    cut = text.rfind(ASSISTANT)
    if cut < 0:
        raise ValueError(f"{where}: the dialogue has no assistant turn ('{ASSISTANT.strip()}'); a preference pair "
                         "needs a response to compare")
    before, response = text[:cut], text[cut + len(ASSISTANT):].strip()
    turns: list[tuple[str, str]] = []
    rest = before
    while rest:
        h, a = rest.find(HUMAN), rest.find(ASSISTANT)
        starts = [(i, r) for i, r in ((h, "user"), (a, "assistant")) if i >= 0]
        if not starts:
            break
        i, role = min(starts)
        marker = HUMAN if role == "user" else ASSISTANT
        rest = rest[i + len(marker):]
        nxt = [j for j in (rest.find(HUMAN), rest.find(ASSISTANT)) if j >= 0]
        end = min(nxt) if nxt else len(rest)
        turns.append((role, rest[:end].strip()))
        rest = rest[end:]
    if not turns or turns[-1][0] != "user":
        raise SkippedPair("no user turn right before the last assistant turn")
    return tuple(turns[:-1]), turns[-1][1], response


def preference_pair(chosen: str, rejected: str, group: str | None, where: str) -> Example:
    """The example of one HH-RLHF-style pair of whole dialogues; ``SkippedPair`` for a pair without a preference or
    a shared prompt, ValueError naming ``where`` for a malformed one."""
    for name, text in (("chosen", chosen), ("rejected", rejected)):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{where}: missing or empty '{name}' text")
    history, prompt, good = split_dialogue(chosen, where)
    history_r, prompt_r, bad = split_dialogue(rejected, where)
    if (history, prompt) != (history_r, prompt_r):
        raise SkippedPair("the chosen and rejected dialogues differ before the last assistant turn")
    return prompt_pair(prompt, good, bad, group, where, history)


def prompt_pair(prompt: str, chosen: str, rejected: str, group: str | None, where: str,
                history: tuple[tuple[str, str], ...] = ()) -> Example:
    """The example of a prompt and its two responses (an empty response is kept: it is the end token alone);
    ``SkippedPair`` if they are identical, ValueError naming ``where`` for an empty prompt."""
    if not prompt.strip():
        raise ValueError(f"{where}: empty prompt")
    if chosen.strip() == rejected.strip():
        raise SkippedPair("the chosen and rejected responses are identical")
    return Example(prompt, 0, None, group, target=chosen, rejected=rejected, history=history)


def preference_task(name: str, train: list[Example], test: list[Example], files: list[Path],
                    skipped: Counter, info: dict[str, str]) -> TaskData:
    """A preference ``TaskData`` (no classes), the skipped pairs counted in its ``info`` and logged."""
    if skipped:
        log.info("task %s: skipped %s", name, "; ".join(f"{n} pairs: {r}" for r, n in sorted(skipped.items())))
    return TaskData(name=name, class_names=[], train=train, test=test, label_words=[], label_descriptions=[],
                    kind="preference", files=[str(p.absolute()) for p in files],
                    info={"kind": "preference", "skipped": json.dumps(dict(sorted(skipped.items())))} | info)


def read_hh_file(path: Path, group: str, skipped: Counter) -> list[Example]:
    """The pairs of one HH-RLHF JSONL(.gz) file, the skipped ones counted in ``skipped``."""
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path} line {i}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where} is not valid JSON ({err.msg})") from None
            if not isinstance(row, dict) or "chosen" not in row or "rejected" not in row:
                raise ValueError(f"{where}: a pair needs the keys 'chosen' and 'rejected'")
            try:
                out.append(preference_pair(row["chosen"], row["rejected"], group, where))
            except SkippedPair as skip:
                skipped[skip.reason] += 1
    return out


LLMBAR_SUBSETS = ("Natural", "Adversarial/Neighbor", "Adversarial/GPTInst", "Adversarial/GPTOut", "Adversarial/Manual")


def read_llmbar(folder: Path) -> list[Example]:
    """LLMBar's 419 pairs (Zeng et al., ICLR 2024; ``shared/data/LLMBar``, see its PROVENANCE.md), a held-out
    preference set: chosen = ``output_<label>``, rejected = the other; ``group`` the subset. ValueError naming the
    file and the pair of a malformed row."""
    out = []
    for subset in LLMBAR_SUBSETS:
        path = folder / subset / "dataset.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: LLMBar's file is missing (shared/data/LLMBar holds it)")
        for i, row in enumerate(json.loads(path.read_text(encoding="utf-8")), start=1):
            where = f"{path} pair {i}"
            if not isinstance(row, dict) or str(row.get("label")) not in ("1", "2") or \
                    not all(isinstance(row.get(k), str) for k in ("input", "output_1", "output_2")):
                raise ValueError(f"{where}: needs 'input', 'output_1', 'output_2' (texts) and 'label' 1 or 2")
            good = row[f"output_{row['label']}"]
            bad = row["output_2" if str(row["label"]) == "1" else "output_1"]
            out.append(Example(row["input"], 0, None, subset, target=good, rejected=bad))
    return out


@TASKS.register("hh-rlhf", "Anthropic HH-RLHF preference pairs (its 4 test splits, 8,552 pairs), one client per "
                           "subset (harmless-base, helpful-base, helpful-online, helpful-rejection-sampled); a fixed "
                           "seeded test_fraction of each held out")
def load_hh_rlhf(cfg: TaskConfig, seed: int) -> TaskData:
    """HH-RLHF's four ``<subset>/test.jsonl.gz``; each subset split into train and held-out pairs with the fixed
    ``SPLIT_SEED`` (the run seed does not move the split)."""
    folder = data_folder(cfg, "HH-RLHF")
    paths = [need_files(folder / s, "test.jsonl.gz", task=cfg.name)[0] for s in HH_SUBSETS]
    skipped: Counter = Counter()
    train: list[Example] = []
    test: list[Example] = []
    for subset, path in zip(HH_SUBSETS, paths):
        tr, te = plain_split(read_hh_file(path, subset, skipped), cfg.test_fraction, SPLIT_SEED)
        train, test = train + tr, test + te
    return preference_task("hh-rlhf", train, test, paths, skipped, {
        "source": str(folder), "origin": "anthropics/hh-rlhf test splits (see HH-RLHF/PROVENANCE.md)",
        "split": f"seeded {cfg.test_fraction} of each subset held out (seed {SPLIT_SEED})"})
