"""The README says what the code does: its weight-format table is the backends' own `supports` answers."""

from pathlib import Path

from edgellm.backends.coverage import WEIGHT_TYPES, coverage

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_readme_format_table_is_what_the_backends_support():
    table = README.split("<!-- capability table -->")[1].split("<!-- end capability table -->")[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.strip().splitlines()]
    header, body = rows[0], rows[2:]
    assert [r[0] for r in body] == WEIGHT_TYPES
    cov = coverage(header[1:])
    checked = 0
    for col, name in enumerate(header[1:], start=1):
        for row in body:
            here = cov[name][row[0]]
            if here is None:  # the backend cannot run on this machine: nothing to compare
                continue
            assert row[col] == ("yes" if here else "fallback"), f"README says {name} {row[0]}: {row[col]}"
            checked += 1
    assert checked >= len(WEIGHT_TYPES)  # the reference column at least
