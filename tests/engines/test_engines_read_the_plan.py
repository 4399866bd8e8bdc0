"""The engines read only the Plan: no module under tpukit/engines reads a recipe's sections (`recipe.train.*`,
`the_plan.recipe.runtime.*`, `getattr(recipe, "data")`, ...). The recipe travels in the Plan only for `tpukit.task`,
which builds the model and the pipelines from it; what an engine needs of it is in `Plan.settings` and
`tpukit.planner.connection` (tests/planner/test_settings.py checks they hold the recipe's values)."""

import ast
import pathlib

import pytest

import tpukit

ENGINES = pathlib.Path(tpukit.__file__).parent / "engines"
SECTIONS = {"train", "runtime", "data", "model"}


def _is_recipe(node: ast.AST) -> bool:
    """A name or attribute called `recipe` (or `..._recipe`)."""
    name = (
        node.id
        if isinstance(node, ast.Name)
        else node.attr
        if isinstance(node, ast.Attribute)
        else ""
    )
    return name == "recipe" or name.endswith("_recipe")


def recipe_reads(source: str) -> list[str]:
    """`line: expression` of every read of a recipe's section in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in SECTIONS and _is_recipe(node.value):
            found.append((node.lineno, node.col_offset, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and node.args
            and _is_recipe(node.args[0])
            and not (
                len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value not in SECTIONS
            )
        ):
            found.append((node.lineno, node.col_offset, ast.unparse(node)))
    return [f"{line}: {text}" for line, _, text in sorted(found)]


def test_the_check_finds_every_form_of_a_read():
    source = """
seed = recipe.train.seed
loop = the_plan.recipe.runtime.loop
config = session.plan.recipe.data
name = self._recipe.model.name
section = getattr(recipe, "train")
path = recipe.path  # the recipe's file name, not a setting
epochs = the_plan.settings.epochs
model = session.model.fit
"""
    assert recipe_reads(source) == [
        "2: recipe.train",
        "3: the_plan.recipe.runtime",
        "4: session.plan.recipe.data",
        "5: self._recipe.model",
        "6: getattr(recipe, 'train')",
    ]


@pytest.mark.parametrize(
    "module", sorted(str(p.relative_to(ENGINES)) for p in ENGINES.rglob("*.py")), ids=str
)
def test_no_engine_module_reads_a_recipe_section(module):
    reads = recipe_reads((ENGINES / module).read_text())
    assert not reads, (
        f"tpukit/engines/{module} reads the recipe: {reads}. Read the Plan instead (`the_plan.settings`, "
        "`tpukit.planner.settings`), or pass `the_plan.recipe` to a `tpukit.task` function."
    )
