"""Wire format details that other implementations rely on: the Hello role stays a plain string on the wire."""

from __future__ import annotations

import msgspec
import pytest

from ft_core.protocol import FrameDecoder, Hello, ProtocolError, Role, encode


def test_role_is_an_enum_with_the_old_wire_values():
    assert Hello(token="t", rank=0).role is Role.RANK
    payload = encode(Hello(token="t", rank=0, role=Role.CONTROL))[4:]
    assert msgspec.msgpack.decode(payload)["role"] == "control"  # a plain string on the wire
    (decoded,) = FrameDecoder().feed(encode(Hello(token="t", rank=1)))
    assert isinstance(decoded, Hello) and decoded.role is Role.RANK


def test_unknown_role_is_a_protocol_error():
    raw = msgspec.msgpack.encode({"type": "hello", "token": "t", "rank": 0, "role": "admin"})
    with pytest.raises(ProtocolError, match="role"):
        FrameDecoder().feed(len(raw).to_bytes(4, "big") + raw)
