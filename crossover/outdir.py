"""Writing a generator's files into the folder named by `--out`, with the user's mistakes (a file
where the folder should be, no permission) as one-line errors."""

from __future__ import annotations

from pathlib import Path

from crossover.errors import UserError


def write_into(out: Path, files: dict[str, str]) -> None:
    """Write each relative name -> text under `out`, creating folders as needed."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out} exists and is not a folder")
    try:
        for name, text in files.items():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"--out: cannot write into {out}: {exc.strerror}") from None
