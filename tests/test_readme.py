"""The README's set-up commands stay true: CI runs exactly the test command the README shows."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    first_blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", readme, flags=re.S)[:2]
    return [block.strip() for block in first_blocks]


def test_readme_starts_with_app_and_test_commands():
    app, tests = setup_commands()
    assert "\n" not in app and "\n" not in tests
    assert app.endswith("streamlit run app.py") and "requirements.txt" in app
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command():
    _, tests = setup_commands()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert tests in ci_lines
    for name in re.findall(r"-r (\S+)", tests):
        assert (ROOT / name).is_file()


def test_every_local_link_and_picture_of_the_docs_exists():
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" not in target:
                assert (doc.parent / target).exists(), f"{doc.name} links to {target}, which is not there"
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", (ROOT / "README.md").read_text())
    assert pictures and all((ROOT / p).stat().st_size > 10_000 for p in pictures)
