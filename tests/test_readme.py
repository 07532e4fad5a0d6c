"""The README's figures against the code that produces them (each able to fail when either moves)."""
from pathlib import Path

from readme_tables import placement_table

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def test_readme_placement_table_is_what_phaze_place_prints():
    assert placement_table() in README


def test_readme_area_power_table_is_the_fit():
    from phaze.area import loo_markdown
    assert loo_markdown() in README
