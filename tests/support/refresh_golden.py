"""Rewrite every golden file from the current code: `make golden`, then review `git diff`."""

from __future__ import annotations

from tests.support.golden import GOLDEN, README, all_goldens, readme_with_choices


def main() -> None:
    goldens = all_goldens()
    for path, text in goldens.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    stale = {p for p in GOLDEN.rglob("*") if p.is_file()} - set(goldens)
    for path in stale:
        path.unlink()
    README.write_text(readme_with_choices(README.read_text()))
    print(f"wrote {len(goldens)} golden files under {GOLDEN}, removed {len(stale)} stale ones")
    print(f"rewrote the table of fields with choices in {README}")


if __name__ == "__main__":
    main()
