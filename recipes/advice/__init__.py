"""The advice of the CLI on a recipe's layout, from one engine: the planner.

    check.py      `recipes check`: validate, estimate memory, exit code, the report it prints
    plan.py       `recipes plan`'s engine: every layout of a cluster, ranked by predicted step time
    plan_text.py  `recipes plan`'s table and the `recipes run` command of its first plan
    suggest.py    what `check` suggests (layouts that fit; a layout that keeps a group inside its
                  NVLink domain), found by plan.py, so that `check` and `plan` never disagree

Nothing here imports torch: `check` and `plan` answer on a login node.
"""
