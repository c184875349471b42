"""Mutated WebRTC offers for fuzzing POST /api/offer: pure functions of a seed offer and a
`random.Random`, so a run is reproduced from its seed.

The seeds are real offers, made once per run by aiortc as a browser-like caller makes them
(audio and a data channel): one whole (its host candidates and end-of-candidates, as
pipecat's clients send it once gathering is done; the candidates moved to one loopback port)
and one trickled (no candidates yet; they would follow by PATCH /api/offer). Each fuzzed
offer stacks one to three mutations of a seed, and now and then mangles the JSON body
around it instead.

Every candidate the server could act on points at loopback: the server sends ICE checks to
the candidates of an offer it accepts, and the fuzzer must not make it reach anything else
(`confine_to_loopback`).
"""

from __future__ import annotations

import ipaddress
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from aioice.mdns import is_mdns_hostname
from aiortc import RTCConfiguration, RTCPeerConnection
from aiortc.sdp import candidate_from_sdp

LOOPBACK = "127.0.0.1"
# configs/default.yaml's server.max_sdp_bytes: offers are kept under it unless a mutation
# means to cross it (then the answer is 413).
MAX_SDP_BYTES = 65_536
MAX_STACKED_MUTATIONS = 3
BODY_MUTATION_SHARE = 0.2  # of fuzzed offers whose JSON body, not their SDP, is mangled

# Values a parser meets at its edges: a port's and a 32-bit field's limits, past 64 bits,
# past Python's 4,300-digit int() limit, and things that look numeric but are not.
EDGE_NUMBERS = ("0", "-1", "65535", "65536", "4294967295", "4294967296", "18446744073709551616", "9" * 400,
                "9" * 5000, "1e309", "NaN", "0x10", "\u0661\u0662", "")
# Characters that change how text splits into lines (str.splitlines, which aiortc uses, breaks
# on more than \r\n), that JSON carries but UTF-8 cannot (lone surrogates), or that are odd.
ODD_CHARACTERS = ("\x00", "\r", "\n", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\ud800", "\udcff", "\ufeff",
                  "\t", " ", "\u00e9", "\U0001f600", ":", "=")


@dataclass(frozen=True)
class FuzzedOffer:
    mutations: tuple[str, ...]  # names of what was done to the seed, in order
    body: bytes  # what is POSTed to /api/offer


async def real_offers(candidate_port: int = 9) -> tuple[str, ...]:
    """The seeds: (whole, trickled). Made with no ICE servers, so nothing beyond this machine is
    asked; the connection is closed at once and its host candidates moved to
    127.0.0.1:`candidate_port` (default: the discard port, where nothing answers)."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        pc.addTransceiver("audio", direction="sendrecv")
        pc.createDataChannel("chat")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
    finally:
        await pc.close()
    whole = re.sub(r"^(a=candidate:\S+ \d+ \S+ \d+ )\S+ \d+", rf"\g<1>{LOOPBACK} {candidate_port}", sdp,
                   flags=re.MULTILINE)
    whole = re.sub(r"^c=IN IP[46] \S+", f"c=IN IP4 {LOOPBACK}", whole, flags=re.MULTILINE)
    trickled = "".join(line for line in whole.splitlines(keepends=True)
                       if not line.startswith(("a=candidate:", "a=end-of-candidates")))
    return whole, trickled


def _lines(sdp: str) -> list[str]:
    return sdp.split("\r\n")


def _join(lines: list[str]) -> str:
    return "\r\n".join(lines)


def _replace_line(sdp: str, rng: random.Random, prefixes: tuple[str, ...], make: Callable[[str], str]) -> str:
    lines = _lines(sdp)
    targets = [i for i, line in enumerate(lines) if line.startswith(prefixes)]
    if targets:
        i = rng.choice(targets)
        lines[i] = make(lines[i])
    return _join(lines)


def delete_line(sdp: str, rng: random.Random) -> str:
    lines = _lines(sdp)
    del lines[rng.randrange(len(lines))]
    return _join(lines)


def duplicate_line(sdp: str, rng: random.Random) -> str:
    lines = _lines(sdp)
    i = rng.randrange(len(lines))
    lines[i:i] = [lines[i]] * rng.choice((1, 2, 50))
    return _join(lines)


def shuffle_lines(sdp: str, rng: random.Random) -> str:
    lines = _lines(sdp)
    start = rng.randrange(len(lines))
    window = lines[start:start + rng.choice((2, 5, len(lines)))]
    rng.shuffle(window)
    lines[start:start + len(window)] = window
    return _join(lines)


def drop_attribute(sdp: str, rng: random.Random) -> str:
    """Everything that names one thing the answer needs: ICE credentials, DTLS, codecs, mids."""
    name = rng.choice(("a=ice-ufrag", "a=ice-pwd", "a=fingerprint", "a=setup", "a=mid", "a=rtpmap", "a=group",
                       "a=rtcp-mux", "a=sctp-port", "a=end-of-candidates", "a=candidate", "c=", "o=", "t=", "m="))
    return _join([line for line in _lines(sdp) if not line.startswith(name)])


def edge_number(sdp: str, rng: random.Random) -> str:
    """A number in a field the parser converts replaced by one at or past its limits."""
    def swap(line: str) -> str:
        numbers = list(re.finditer(r"\d+", line))
        if not numbers:
            return line
        n = rng.choice(numbers)
        return line[:n.start()] + rng.choice(EDGE_NUMBERS) + line[n.end():]
    return _replace_line(sdp, rng, ("m=", "c=", "o=", "t=", "a=rtpmap", "a=ptime", "a=maxptime", "a=rtcp:", "a=ssrc",
                                    "a=sctp-port", "a=max-message-size", "a=extmap", "a=fmtp", "a=candidate"), swap)


def unknown_codec(sdp: str, rng: random.Random) -> str:
    name = rng.choice(("x-unknown/8000", "opus/0/2", "opus/48000/0", "opus", "H264/90000", "rtx/48000",
                       "telephone-event/8000", "", "PCMU/8000/1/1"))
    payload = rng.choice(("96", "0", "127", "128", "255", "-1", "abc"))
    if rng.random() < 0.5:
        return _replace_line(sdp, rng, ("a=rtpmap",), lambda line: f"a=rtpmap:{payload} {name}")
    formats = rng.choice(("", "abc", "96 96 96", "200", " ".join(str(n) for n in range(128)), "9" * 30))
    return _replace_line(sdp, rng, ("m=audio",), lambda line: " ".join(line.split(" ")[:3] + [formats]))


def setup_role(sdp: str, rng: random.Random) -> str:
    role = rng.choice(("active", "passive", "actpass", "holdconn", "", "ACTIVE", "active passive", "x"))
    return _replace_line(sdp, rng, ("a=setup",), lambda line: f"a=setup:{role}")


def bad_fingerprint(sdp: str, rng: random.Random) -> str:
    algorithm = rng.choice(("sha-256", "sha-1", "md5", "sha-999", "", "SHA-256"))
    value = rng.choice(("", "ZZ", "00:" * 31 + "0", "00:" * 31 + "00", "AB" * 40, ":::"))
    return _replace_line(sdp, rng, ("a=fingerprint",), lambda line: f"a=fingerprint:{algorithm} {value}".rstrip())


def direction(sdp: str, rng: random.Random) -> str:
    chosen = rng.choice(("a=inactive", "a=sendonly", "a=recvonly", "a=sendrecv", "a=bothways"))
    if rng.random() < 0.3:  # a rejected media section: port 0
        return _replace_line(sdp, rng, ("m=audio",), lambda line: re.sub(r"^m=audio \d+", "m=audio 0", line))
    return _replace_line(sdp, rng, ("a=sendrecv",), lambda line: chosen)


def odd_mid(sdp: str, rng: random.Random) -> str:
    mid = rng.choice(("", "0", "1", "x" * 300, "0 1", "\udcff", "\u00e9"))
    if rng.random() < 0.5:
        return _replace_line(sdp, rng, ("a=mid",), lambda line: f"a=mid:{mid}")
    return _replace_line(sdp, rng, ("a=group:BUNDLE",), lambda line: f"a=group:BUNDLE {mid} 7 0 0")


def bogus_candidate(sdp: str, rng: random.Random) -> str:
    """A candidate line with fields at their edges, on loopback or on no address at all."""
    fields = [rng.choice(("1", "x" * 40, "")), rng.choice(("1", "2", "0", "256", "99999999999")),
              rng.choice(("udp", "UDP", "tcp", "sctp", "x")),
              rng.choice(("2130706431", "0", "-1", "18446744073709551616")),
              rng.choice((LOOPBACK, "::1", "127.255.255.254", "not-an-address", "999.1.1.1", "localhost", "::")),
              rng.choice(("9", "0", "65535", "65536", "-5", "x")), "typ",
              rng.choice(("host", "srflx", "relay", "prflx", "bogus"))]
    fields += rng.choice(([], ["raddr", "0.0.0.0", "rport", "0"], ["tcptype", "active"], ["generation"], ["raddr"]))
    line = "a=candidate:" + " ".join(fields[:rng.choice((len(fields), 8, 5, 1))])
    lines = _lines(sdp)
    lines.insert(rng.randrange(len(lines) + 1), line)
    return _join(lines)


def huge_attribute(sdp: str, rng: random.Random) -> str:
    """One long line or thousands of short ones, mostly under the size limit, now and then over it."""
    size = rng.choice((1_000, 20_000, 50_000, MAX_SDP_BYTES + 1))
    line = rng.choice(("a=x-fuzz:" + "A" * size, "a=ssrc:1 cname:" + "c" * size,
                       "a=fmtp:96 " + ";".join(f"p{n}=1" for n in range(size // 6)),
                       "\r\n".join(f"a=rtpmap:{96 + n % 30} opus/48000/2" for n in range(size // 25))))
    lines = _lines(sdp)
    lines.insert(rng.randrange(1, len(lines) + 1), line)
    return _join(lines)


def odd_characters(sdp: str, rng: random.Random) -> str:
    at = rng.randrange(len(sdp) + 1)
    return sdp[:at] + rng.choice(ODD_CHARACTERS) * rng.choice((1, 1, 3, 1000)) + sdp[at:]


def line_endings(sdp: str, rng: random.Random) -> str:
    return sdp.replace("\r\n", rng.choice(("\n", "\r", "\n\r", "\r\r\n", "", "\r\n\r\n")))


def flip_bits(sdp: str, rng: random.Random) -> str:
    chars = list(sdp)
    for _ in range(rng.choice((1, 2, 8, 64))):
        i = rng.randrange(len(chars))
        if ord(chars[i]) < 256:
            chars[i] = chr(ord(chars[i]) ^ (1 << rng.randrange(8)))
    return "".join(chars)


def truncate(sdp: str, rng: random.Random) -> str:
    return sdp[:rng.randrange(len(sdp))]


def extra_media(sdp: str, rng: random.Random) -> str:
    """Another media section: the audio one again, as video, or a bare one the parser must reject."""
    lines = _lines(sdp)
    start = next((i for i, line in enumerate(lines) if line.startswith("m=audio")), None)
    if start is None:
        return sdp
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("m=")), len(lines))
    section = lines[start:end]
    kind = rng.choice(("audio", "video", "text", "application", "bare"))
    if kind == "bare":
        section = [rng.choice(("m=audio", "m=video 9", "m=application 9 UDP/DTLS/SCTP", "m="))]
    else:
        section = [section[0].replace("m=audio", f"m={kind}", 1)] + section[1:]
    lines[end:end] = section
    return _join(lines)


SDP_MUTATIONS: dict[str, Callable[[str, random.Random], str]] = {
    f.__name__: f for f in (delete_line, duplicate_line, shuffle_lines, drop_attribute, edge_number, unknown_codec,
                            setup_role, bad_fingerprint, direction, odd_mid, bogus_candidate, huge_attribute,
                            odd_characters, line_endings, flip_bits, truncate, extra_media)}


def _offer_json(sdp: str, **fields: object) -> bytes:
    return json.dumps({"sdp": sdp, "type": "offer", **fields}).encode()


def _not_json(sdp: str, rng: random.Random) -> bytes:
    choices = (sdp.encode("utf-8", "surrogatepass"), rng.randbytes(rng.choice((0, 1, 100, 5000))),
               _offer_json(sdp)[:rng.randrange(1, 200)], b"{" * 30_000, b"[" * 30_000 + b"]" * 30_000)
    return rng.choice(choices)


def _wrong_types(sdp: str, rng: random.Random) -> bytes:
    value = rng.choice((None, 1, 1.5, True, [sdp], {"sdp": sdp}, ""))
    top = rng.choice((json.dumps({"sdp": value, "type": "offer"}), json.dumps([sdp, "offer"]), json.dumps(sdp),
                      "1", "null", "true", json.dumps({"offer": {"sdp": sdp, "type": "offer"}})))
    return top.encode()


def _wrong_kind(sdp: str, rng: random.Random) -> bytes:
    kind = rng.choice(("answer", "pranswer", "rollback", "Offer", "OFFER", "", " offer", None, 1, ["offer"]))
    return json.dumps({"sdp": sdp, "type": kind} if rng.random() < 0.8 else {"sdp": sdp}).encode()


def _not_utf8(sdp: str, rng: random.Random) -> bytes:
    body = _offer_json(sdp)
    at = rng.randrange(len(body) + 1)
    return body[:at] + rng.choice((b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80")) + body[at:]


def _other_encoding(sdp: str, rng: random.Random) -> bytes:
    """JSON in UTF-16/32 (json.loads reads these), or behind a byte-order mark (it refuses that)."""
    text = json.dumps({"sdp": sdp, "type": "offer"})
    return rng.choice((text.encode("utf-16"), text.encode("utf-32-le"), b"\xef\xbb\xbf" + text.encode()))


def _extra_fields(sdp: str, rng: random.Random) -> bytes:
    extra = rng.choice(({"pc_id": "x"}, {"pc_id": None}, {"pc_id": 1}, {"agent": 5}, {"agent": "no-such-agent"},
                        {"request_data": {"agent": []}}, {"requestData": [1]}, {"restart_pc": True},
                        {"x": float("inf")}, {"x": [[[]]] * 100}))
    return json.dumps({"sdp": sdp, "type": "offer", **extra}).encode()


def _odd_json_numbers(sdp: str, rng: random.Random) -> bytes:
    """Numbers JSON allows and Python may not: past int()'s 4,300-digit limit, or overflowing a float."""
    literal = rng.choice(("9" * 5000, "1e99999", "-0", "NaN", "Infinity"))
    return ('{"sdp": %s, "type": "offer", "n": %s}' % (json.dumps(sdp), literal)).encode()


def _oversize(sdp: str, rng: random.Random) -> bytes:
    return _offer_json(sdp + "a=x-pad:" + "p" * MAX_SDP_BYTES)


BODY_MUTATIONS: dict[str, Callable[[str, random.Random], bytes]] = {
    "not_json": _not_json, "wrong_json_types": _wrong_types, "wrong_type": _wrong_kind, "not_utf8": _not_utf8,
    "other_encoding": _other_encoding, "extra_fields": _extra_fields, "odd_json_numbers": _odd_json_numbers,
    "oversize_body": _oversize}


def _candidate_is_safe(value: str) -> bool:
    """False if aiortc would parse this candidate and aioice send to (or resolve) something
    that is not loopback; aioice contacts only IP addresses and resolves only mDNS names."""
    try:
        host = candidate_from_sdp(value).ip
    except Exception:  # a candidate aiortc cannot parse fails the whole offer: nothing is sent
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return not is_mdns_hostname(host)


def confine_to_loopback(sdp: str) -> str:
    """`sdp` without the candidate lines that would point the server anywhere but loopback.
    Lines are read as aiortc reads them (str.splitlines; `a=candidate:` then the value)."""
    return "".join(line for line in sdp.splitlines(keepends=True)
                   if not (line.startswith("a=candidate:") and not _candidate_is_safe(line.rstrip()[12:])))


def mutate(seed: str, rng: random.Random, names: tuple[str, ...]) -> str:
    sdp = seed
    for name in names:
        sdp = SDP_MUTATIONS[name](sdp, rng) or sdp[:1]  # never empty: the next one picks a place in it
    return confine_to_loopback(sdp)


def fuzzed_offer(seeds: tuple[str, ...], rng: random.Random) -> FuzzedOffer:
    """One fuzzed offer: a seed with 1-3 SDP mutations, or a seed in a mangled JSON body."""
    seed = rng.choice(seeds)
    if rng.random() < BODY_MUTATION_SHARE:
        name = rng.choice(sorted(BODY_MUTATIONS))
        sdp = seed if rng.random() < 0.5 else mutate(seed, rng, (rng.choice(sorted(SDP_MUTATIONS)),))
        return FuzzedOffer((name,), BODY_MUTATIONS[name](confine_to_loopback(sdp), rng))
    names = tuple(rng.choice(sorted(SDP_MUTATIONS)) for _ in range(rng.randint(1, MAX_STACKED_MUTATIONS)))
    return FuzzedOffer(names, _offer_json(mutate(seed, rng, names)))
