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
