"""docs/outputs/gguf-not-written.md against the pinned converter's tables of architectures (read from its source, not
imported) and unshard's family registry: the page lists exactly the converter's names unshard does not write, the
classes it names are transformers', the names it says transformers lacks are not, and a model it says is written
under another name is."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import generate
import transformers

from unshard import families

PAGE = Path(__file__).parents[1] / "docs" / "outputs" / "gguf-not-written.md"
PART = {"text": "gguf", "mmproj": "mmproj"}  # (the page's files, by the registry's parts)


def converter_tables() -> dict[str, dict[str, str]]:
    """The converter's TEXT_MODEL_MAP and MMPROJ_MODEL_MAP (architecture name -> its module), literals of its
    conversion/__init__.py."""
    source = (generate.llama_cpp_source() / "conversion" / "__init__.py").read_text()
    return {
        node.target.id: ast.literal_eval(node.value)
        for node in ast.parse(source).body
        if isinstance(node, ast.AnnAssign) and node.target.id in ("TEXT_MODEL_MAP", "MMPROJ_MODEL_MAP")
    }


def written(part: str) -> set[str]:
    return {name for family in families.with_part(part) for name in (family.architecture, *family.also)}


def quoted(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def test_the_page_lists_exactly_the_converter_s_names_unshard_does_not_write():
    tables = converter_tables()
    converter = {"text": set(tables["TEXT_MODEL_MAP"]), "mmproj": set(tables["MMPROJ_MODEL_MAP"])}
    not_written = {file: names - written(PART[file]) for file, names in converter.items()}
    page = PAGE.read_text()
    counts = re.search(r"knows (\d+) architecture names .* and (\d+) for an mmproj", page.replace("\n", " "))
    assert counts and (int(counts[1]), int(counts[2])) == (len(converter["text"]), len(converter["mmproj"]))
    with_class, without_class = page.split("## Names transformers has no class of")

    listed: dict[str, set[str]] = {"text": set(), "mmproj": set()}
    rows = [line.strip("|").split(" | ") for line in with_class.splitlines() if line.startswith("| `")]
    assert rows
    for names, files, transformers_class, unshard in rows:
        assert hasattr(transformers, quoted(transformers_class)[0]), transformers_class
        for file in files.split(", "):
            listed[file] |= set(quoted(names))
            if "written as" in unshard:  # (the model under transformers' name, which unshard writes)
                target = quoted(unshard.split("written as", 1)[1])[0]
                family = families.by_architecture(target)
                assert family is not None and families.supports(family, PART[file]), (target, file)
            else:
                assert unshard.startswith("not written"), unshard
    for file in listed:
        assert listed[file] <= not_written[file], (file, listed[file] - not_written[file])

    others = set(re.findall(r"`([\w.]+)`", without_class))  # (the names: the prose quotes a command too)
    assert others and not [name for name in others if hasattr(transformers, name)]
    in_table = listed["text"] | listed["mmproj"]
    assert not others & in_table
    assert in_table | others == not_written["text"] | not_written["mmproj"], (
        "not on the page:",
        sorted((not_written["text"] | not_written["mmproj"]) - in_table - others),
        "written or not the converter's:",
        sorted((in_table | others) - not_written["text"] - not_written["mmproj"]),
    )
    for file in listed:  # (a name of the table unshard does not write for a file the row leaves out)
        assert not_written[file] - others <= listed[file], (file, not_written[file] - others - listed[file])
