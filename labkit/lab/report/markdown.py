"""Markdown helpers the report tables share (labkit.lab.report.generate and the table modules beside it)."""

from __future__ import annotations


def md_row(cells) -> str:
    """One table row: `| a | b |`."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def md_head(head) -> list[str]:
    """A table's header row and the rule under it."""
    return [md_row(head), md_row(["---"] * len(head))]


def md_cell(value) -> str:
    """A cell's text with its pipes escaped (a bare `|` would split the cell)."""
    return str(value).replace("|", "\\|")
