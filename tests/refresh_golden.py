"""Rewrite every golden file from the current code: `make golden`, then review `git diff`."""

from __future__ import annotations

from tests.golden import GOLDEN, all_goldens


def main() -> None:
    goldens = all_goldens()
    for path, text in goldens.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    stale = {p for p in GOLDEN.rglob("*") if p.is_file()} - set(goldens)
    for path in stale:
        path.unlink()
    print(f"wrote {len(goldens)} golden files under {GOLDEN}, removed {len(stale)} stale ones")


if __name__ == "__main__":
    main()
