"""File tools: ``list_files``, ``read_file_info``, ``send_email``, ``send_file``.

Why: a listing names files with their owners and sizes, and only the listing does; "email the
owner of report_v2.xlsx" needs an address that no user message contains.

Why two mail tools: with one ``send_email`` whose attachment was an optional argument, the
default model attached a file to 5 of the 7 plain emails of three dev conversations at Full
KV (``results/dev_checks/agent_layout_name_first.md``). A tool whose arguments are all
required says by its name whether a file goes along.
"""

from __future__ import annotations

from typing import Any

from pask_agent.eval.agent_sandbox.world import World, new_id

_MAIL: dict[str, Any] = {
    "to": {"type": "string", "description": "Recipient email address"},
    "subject": {"type": "string", "description": "Subject line"},
}
_FILE_ID = {
    "type": "string",
    "description": "The file_id field (file_ and 8 hex digits) of the file",
}

SPECS: tuple[dict[str, Any], ...] = (
    {
        "name": "list_files",
        "description": "List the files in a shared-drive folder with their owners and sizes.",
        "parameters": {
            "type": "object",
            "properties": {
                "folder": {"type": "string", "description": "Folder name, as the user says it"},
            },
            "required": ["folder"],
        },
    },
    {
        "name": "read_file_info",
        "description": "Get the full metadata of one file: path, owner, sharing, versions.",
        "parameters": {
            "type": "object",
            "properties": {
                "file_id": {
                    "type": "string",
                    "description": (
                        "The file_id field (file_ and 8 hex digits) list_files returned for "
                        "the file; not its name"
                    ),
                },
            },
            "required": ["file_id"],
        },
    },
    {
        "name": "send_email",
        "description": "Send a plain email (no attachment) from the user's account.",
        "parameters": {"type": "object", "properties": _MAIL, "required": ["to", "subject"]},
    },
    {
        "name": "send_file",
        "description": "Email one shared-drive file, attached, from the user's account.",
        "parameters": {
            "type": "object",
            "properties": {**_MAIL, "file_id": _FILE_ID},
            "required": ["to", "subject", "file_id"],
        },
    },
)

_LIST_KEYS = ("file_id", "name", "type", "owner", "size_bytes", "modified")


def _human(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{size} B"
        size /= 1024  # type: ignore[assignment]
    return ""


def list_files(world: World, folder: str) -> dict[str, Any]:
    found = [f for f in world["files"] if f["folder"].casefold() == folder.strip().casefold()]
    if not found:
        folders = sorted({f["folder"] for f in world["files"]})
        return {"error": f"no folder named {folder!r}", "folders": folders}
    return {
        "folder": found[0]["folder"],
        "file_count": len(found),
        "files": [{k: f[k] for k in _LIST_KEYS} for f in found],
    }


def read_file_info(world: World, file_id: str) -> dict[str, Any]:
    file = next((f for f in world["files"] if f["file_id"] == file_id.strip()), None)
    if file is None:
        return {"error": f"no file with id {file_id!r}"}
    return {
        "file_id": file["file_id"],
        "name": file["name"],
        "path": f"/shared/{file['folder']}/{file['name']}",
        "type": file["type"],
        "owner": {"name": file["owner_name"], "email": file["owner"]},
        "size_bytes": file["size_bytes"],
        "size": _human(file["size_bytes"]),
        "created": file["created"],
        "modified": file["modified"],
        "version": file["version"],
        "shared_with": file["shared_with"],
        "description": file["description"],
    }


def send_email(world: World, to: str, subject: str) -> dict[str, Any]:
    return _send(world, to, subject, None)


def send_file(world: World, to: str, subject: str, file_id: str) -> dict[str, Any]:
    file = next((f for f in world["files"] if f["file_id"] == file_id), None)
    if file is None:
        return {"error": f"no file with id {file_id!r} to attach"}
    return _send(world, to, subject, {"file_id": file["file_id"], "name": file["name"]})


def _send(world: World, to: str, subject: str, attachment: dict | None) -> dict[str, Any]:
    if "@" not in to:
        return {"error": f"{to!r} is not an email address"}
    email = {
        "message_id": new_id(world, "MSG"),
        "from": world["user"]["email"],
        "to": to.strip(),
        "subject": subject,
        "attachment": attachment,
    }
    world["emails"].append(email)
    known = {c["email"]: c for c in world["colleagues"]}
    recipient = known.get(email["to"], {})
    return {
        **email,
        "status": "sent",
        "sent_at": f"{world['today']}T10:{world['counter'] % 60:02d}:00Z",
        "recipient": {"name": recipient.get("name"), "department": recipient.get("department"),
                      "in_directory": bool(recipient)},
        "folder": "Sent",
    }  # fmt: skip


FUNCTIONS = {"list_files": list_files, "read_file_info": read_file_info,
             "send_email": send_email, "send_file": send_file}  # fmt: skip
