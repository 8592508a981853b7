"""One credential reader for the daemon's config and the gateway's --token-credential: each
way it can fail is one line that names the setting and says what to do."""

from __future__ import annotations

import pytest

from llm_watchdog.credentials import read_credential

KEY, INSTEAD = "--token-credential", "--token-file"


def test_the_secret_is_read_and_stripped(tmp_path) -> None:
    (tmp_path / "control-token").write_text("s3cret\n")
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path)}
    assert read_credential("control-token", KEY, INSTEAD, env) == "s3cret"


@pytest.mark.parametrize(
    ("name", "content", "env_set", "says"),
    [
        ("../token", None, True, "is a credential name, not a path"),
        ("control-token", None, False, r"\$CREDENTIALS_DIRECTORY is not set.*or use --token-file"),
        ("control-token", None, True, "cannot read credential .*add LoadCredential=control-token"),
        ("control-token", b"\xff\xfe", True, "is not UTF-8 text"),
        ("control-token", b"\n", True, "is empty; write the secret"),
    ],
)
def test_each_failure_is_one_line_naming_the_setting(
    tmp_path, name: str, content: bytes | None, env_set: bool, says: str
) -> None:
    if content is not None:
        (tmp_path / name).write_bytes(content)
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path)} if env_set else {}
    with pytest.raises(ValueError, match=says) as err:
        read_credential(name, KEY, INSTEAD, env)
    assert str(err.value).startswith(KEY) and "\n" not in str(err.value)
