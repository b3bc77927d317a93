"""The file tools `read`, `write` and `edit`: the harness's names, parameters and result formats.

`read` numbers lines inside the `<path>/<type>/<content>` envelope, pages with offset and limit,
caps what one call returns and refuses binary files and text that is not UTF-8. `write` creates or
replaces atomically. `edit` replaces text that must occur once unless `replace_all`, and shows the
change. In the read-only sandbox mode `write` and `edit` change nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dsh.agent.approval import Permissions
from dsh.agent.errors import ToolError
from tests.workspace.helpers import invoke, tools_by_name


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A folder with a five-line text file."""
    (tmp_path / "notes.txt").write_text("one\ntwo\nthree\nfour\nfive\n", encoding="utf-8")
    return tmp_path


async def test_read_numbers_every_line_and_says_where_the_file_ends(workspace: Path) -> None:
    """A whole small file comes back numbered from 1, with the end-of-file footer."""
    text, _ = await invoke(tools_by_name(workspace)["read"], {"file_path": "notes.txt"})
    assert text == (
        "<path>notes.txt</path>\n<type>file</type>\n<content>\n"
        "1: one\n2: two\n3: three\n4: four\n5: five\n\n(End of file - total 5 lines)\n</content>"
    )


async def test_read_pages_with_offset_and_limit(workspace: Path) -> None:
    """`offset` and `limit` choose a window; the footer says how to continue."""
    text, _ = await invoke(tools_by_name(workspace)["read"], {"file_path": "notes.txt", "offset": 2, "limit": 2})
    assert "2: two\n3: three\n\n(Showing lines 2-3 of 5. Use offset=4 to continue.)" in text
    assert "1: one" not in text


async def test_read_caps_lines_and_bytes_per_call(tmp_path: Path) -> None:
    """The line cap and the byte cap stop a call early; a line over 2,000 characters is cut."""
    (tmp_path / "long.txt").write_text("".join(f"line {n}\n" for n in range(1, 5001)), encoding="utf-8")
    (tmp_path / "wide.txt").write_text("x" * 5000 + "\nshort\n", encoding="utf-8")
    tools = tools_by_name(tmp_path, read_max_lines=100, read_max_bytes=300)
    by_lines, _ = await invoke(tools_by_name(tmp_path, read_max_lines=100)["read"], {"file_path": "long.txt"})
    assert "(Showing lines 1-100 of 5000. Use offset=101 to continue.)" in by_lines
    by_bytes, _ = await invoke(tools["read"], {"file_path": "long.txt"})
    assert "(Output capped. Showing lines 1-" in by_bytes
    assert len(by_bytes.encode()) < 600
    wide, _ = await invoke(tools_by_name(tmp_path)["read"], {"file_path": "wide.txt"})
    assert "1: " + "x" * 2000 + "... (line truncated to 2000 chars)\n2: short" in wide


@pytest.mark.parametrize(
    ("content", "reason"),
    [(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary file"), (b"caf\xe9 au lait\n", "invalid UTF-8 text")],
)
async def test_read_refuses_binary_files_and_text_that_is_not_utf8(tmp_path: Path, content: bytes, reason: str) -> None:
    """A NUL byte near the start, or bytes that are not UTF-8, refuse the read with `FILE_NOT_TEXT`."""
    (tmp_path / "data.bin").write_bytes(content)
    with pytest.raises(ToolError) as raised:
        await invoke(tools_by_name(tmp_path)["read"], {"file_path": "data.bin"})
    assert raised.value.code == "FILE_NOT_TEXT"
    assert raised.value.message == f'cannot read "data.bin": {reason}'


async def test_read_names_a_missing_file_a_folder_and_an_offset_past_the_end(workspace: Path) -> None:
    """Not found, not a regular file and an offset past the end each have their code and message."""
    read = tools_by_name(workspace)["read"]
    (workspace / "folder").mkdir()
    cases = [
        ({"file_path": "missing.txt"}, "FILE_NOT_FOUND", 'cannot read "missing.txt": not found'),
        ({"file_path": "folder"}, "FILE_NOT_REGULAR", 'cannot read "folder": not a regular file'),
        (
            {"file_path": "notes.txt", "offset": 9},
            "READ_OUT_OF_RANGE",
            'offset 9 is out of range for "notes.txt" (5 lines)',
        ),
    ]
    for args, code, message in cases:
        with pytest.raises(ToolError) as raised:
            await invoke(read, args)
        assert (raised.value.code, raised.value.message) == (code, message)


async def test_write_creates_then_replaces_a_file_atomically(tmp_path: Path) -> None:
    """write creates a file (and its folders), then replaces it; no temporary file is left behind."""
    write = tools_by_name(tmp_path)["write"]
    created, output = await invoke(write, {"file_path": "deep/new.txt", "content": "first\n"})
    assert output == {"path": "deep/new.txt", "operation": "create"}
    assert created == "<path>deep/new.txt</path>\n<type>file</type>\n<content>\nCreated file\n</content>"
    (tmp_path / "deep" / "new.txt").chmod(0o640)
    updated, _ = await invoke(write, {"file_path": "deep/new.txt", "content": "second\n"})
    assert "Updated file" in updated
    assert (tmp_path / "deep" / "new.txt").read_text() == "second\n"
    assert (tmp_path / "deep" / "new.txt").stat().st_mode & 0o777 == 0o640
    assert sorted(path.name for path in (tmp_path / "deep").iterdir()) == ["new.txt"]


async def test_edit_replaces_one_occurrence_and_shows_the_change(workspace: Path) -> None:
    """An edit of text that occurs once changes the file and returns a unified diff of the change."""
    text, output = await invoke(
        tools_by_name(workspace)["edit"], {"file_path": "notes.txt", "old_string": "three", "new_string": "THREE"}
    )
    assert (workspace / "notes.txt").read_text() == "one\ntwo\nTHREE\nfour\nfive\n"
    assert text.startswith("The file notes.txt has been updated successfully.\n\n--- a/notes.txt\n+++ b/notes.txt\n")
    assert "-three\n+THREE" in text
    assert output["replacements"] == 1


async def test_edit_refuses_a_missing_or_ambiguous_match_unless_told_to_replace_all(tmp_path: Path) -> None:
    """No match is `EDIT_NOT_FOUND`; several are `EDIT_AMBIGUOUS` unless replace_all, which replaces them all."""
    (tmp_path / "a.txt").write_text("x = 1\nx = 1\n", encoding="utf-8")
    edit = tools_by_name(tmp_path)["edit"]
    with pytest.raises(ToolError) as missing:
        await invoke(edit, {"file_path": "a.txt", "old_string": "y = 1", "new_string": "y = 2"})
    assert missing.value.code == "EDIT_NOT_FOUND"
    with pytest.raises(ToolError) as ambiguous:
        await invoke(edit, {"file_path": "a.txt", "old_string": "x = 1", "new_string": "x = 2"})
    assert ambiguous.value.code == "EDIT_AMBIGUOUS"
    assert "matched 2 times" in ambiguous.value.message
    assert (tmp_path / "a.txt").read_text() == "x = 1\nx = 1\n"
    text, _ = await invoke(
        edit, {"file_path": "a.txt", "old_string": "x = 1", "new_string": "x = 2", "replace_all": True}
    )
    assert (tmp_path / "a.txt").read_text() == "x = 2\nx = 2\n"
    assert text.startswith("The file a.txt has been updated. All 2 occurrences were replaced.")


async def test_edit_matches_lf_text_in_a_crlf_file(tmp_path: Path) -> None:
    """Text written with LF line ends matches a file that uses CRLF, which keeps its line ends."""
    (tmp_path / "win.txt").write_bytes(b"alpha\r\nbeta\r\ngamma\r\n")
    await invoke(
        tools_by_name(tmp_path)["edit"],
        {"file_path": "win.txt", "old_string": "alpha\nbeta", "new_string": "ALPHA\nBETA"},
    )
    assert (tmp_path / "win.txt").read_bytes() == b"ALPHA\r\nBETA\r\ngamma\r\n"


async def test_read_only_mode_refuses_write_and_edit_with_the_sandbox_marker(workspace: Path) -> None:
    """Under the read-only sandbox mode, write and edit raise `SANDBOX_DENIED` and change nothing."""
    tools = tools_by_name(workspace)
    read_only = Permissions(sandbox="read-only")
    for name, args in (
        ("write", {"file_path": "notes.txt", "content": "gone"}),
        ("edit", {"file_path": "notes.txt", "old_string": "one", "new_string": "ONE"}),
    ):
        with pytest.raises(ToolError) as raised:
            await invoke(tools[name], args, permissions=read_only)
        assert raised.value.code == "SANDBOX_DENIED"
        assert "[sandbox: file access denied under read-only mode]" in raised.value.message
    assert (workspace / "notes.txt").read_text() == "one\ntwo\nthree\nfour\nfive\n"


async def test_write_and_edit_describe_the_exact_change_for_approval(workspace: Path) -> None:
    """The approval preview of write is the diff (or the new file), of edit its diff; the subject is normalized."""
    from dsh.abort import AbortController
    from dsh.agent.tools import ToolContext
    from dsh.services import Services

    tools = tools_by_name(workspace)
    ctx = ToolContext(agent=None, call_id="c", signal=AbortController().signal, services=Services())
    write = tools["write"].args_model.model_validate({"file_path": "notes.txt", "content": "one\n2\n"})
    assert await tools["write"].call_subject(write, ctx) == "notes.txt"
    preview = await tools["write"].call_preview(write, ctx)
    assert "\n-two\n" in preview
    assert "\n+2" in preview
    new = tools["write"].args_model.model_validate({"file_path": "fresh.txt", "content": "hello\n"})
    assert await tools["write"].call_preview(new, ctx) == "write fresh.txt (new file, 1 lines)\n+hello"
    edit = tools["edit"].args_model.model_validate({"file_path": "notes.txt", "old_string": "four", "new_string": "4"})
    assert "-four\n+4" in await tools["edit"].call_preview(edit, ctx)
    for spelled in ("./notes.txt", str(workspace / "notes.txt"), "sub/../notes.txt"):
        (workspace / "sub").mkdir(exist_ok=True)
        same = tools["edit"].args_model.model_validate({"file_path": spelled, "old_string": "a", "new_string": "b"})
        assert await tools["edit"].call_subject(same, ctx) == "notes.txt"
