#!/usr/bin/env python3
"""Validates normalized message lists against the providers' own SDK request types.

Reads JSON on stdin: a list of cases
    {"name": str, "provider": "anthropic"|"openai"|"openai_responses"|"gemini", "messages": [...],
     "tools": [...]}  (`tools` optional)
and checks every message / item and every tool of each case strictly, unknown keys refused:

                      messages                                         tools
    anthropic         anthropic.types.beta.BetaMessageParam            BetaToolUnionParam  (anthropic 2.16)
    openai            openai.types.chat.ChatCompletionMessageParam     ChatCompletionToolUnionParam  (openai 3.60)
    openai_responses  openai.types.responses.ResponseInputItemParam    ToolParam  (openai 3.60)
    gemini            google.genai.types.Content, by camelCase alias   Tool  (google-genai 3.6)

A tool's `Required` keys are required: Responses' `FunctionToolParam` requires `strict` (a
function sent without it is strict, which makes every property required).

Prints {"checked": n, "failures": [{"name", "index", "errors": [...]}]} and exits 1 when any
case fails. `--selftest` proves the checker refuses what it must (see `selftest`).

The SDKs' TypedDicts are not validated as they are: a plain `TypeAdapter(BetaMessageParam,
config=ConfigDict(extra="forbid"))` accepts anything inside `content`, since pydantic validates
`Iterable[...]` fields lazily (never, for a value nobody iterates), the config does not reach the
nested TypedDicts, and some request unions also list response models that allow extra keys
(anthropic's `BetaContentBlockParam` ends with `BetaContentBlock`). So each request type is rebuilt
(`strict`): every TypedDict copied with `extra='forbid'` (its `Required` keys read from the
resolved hints: the SDKs' `from __future__ import annotations` hides them from
`__required_keys__`), `Iterable`/`Sequence` made `List`, response models and file objects left out
of request unions, and every union given a discriminator: the value's JSON kind (a string or a
list of blocks), then the member its `Literal` fields (`type`, `role`) name, so an error names one
member instead of listing all of them (several members named and none fits: what each refuses).
Gemini's types are pydantic models that already forbid extra keys; they are validated from JSON by
alias only (`functionCall`, not `function_call`; `Part`'s own `__init__` takes Python names, so
those are refused by a walk of their own), with base64 bytes.
"""

from __future__ import annotations

import collections.abc
import json
import os
import sys
import types as pytypes
import typing
from typing import Any, Dict, List, Literal, Union

import pydantic
import typing_extensions as te
from pydantic import ConfigDict, Discriminator, Tag, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

MAX_ERRORS = 5

FORBID = ConfigDict(extra="forbid")

# --------------------------------------------------------------------------------------------
# Strict copies of the SDKs' TypedDict request types


_copies: Dict[type, type] = {}
_adapters: Dict[Any, TypeAdapter] = {}


def _adapter(tp: Any) -> TypeAdapter:
    if tp not in _adapters:
        _adapters[tp] = TypeAdapter(tp)
    return _adapters[tp]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, pydantic.BaseModel)


def _strip_required(tp: Any) -> Any:
    while te.get_origin(tp) in (te.Required, te.NotRequired, typing.ClassVar):
        tp = te.get_args(tp)[0]
    return tp


def _literal_values(tp: Any) -> tuple | None:
    """The values of a `Literal` field (through Required/Annotated/Optional), else None."""
    tp = _strip_required(tp)
    if te.get_origin(tp) is te.Annotated:
        tp = te.get_args(tp)[0]
    if te.get_origin(tp) is Literal:
        return te.get_args(tp)
    if te.get_origin(tp) in (Union, pytypes.UnionType):  # Optional[Literal[...]]
        args = [a for a in te.get_args(tp) if a is not type(None)]
        if len(args) == 1 and te.get_origin(args[0]) is Literal:
            return te.get_args(args[0]) + (None,)
    return None


def _copy_typeddict(td: type) -> type:
    if td in _copies:
        return _copies[td]
    copy = te.TypedDict(td.__name__, {}, total=False)  # filled below: recursion finds it here
    _copies[td] = copy
    hints = te.get_type_hints(td, include_extras=True)
    # The SDKs' modules use `from __future__ import annotations`, so `Required[...]` is a string
    # when the class is made and `__required_keys__` misses it: read it from the resolved hints.
    required = set()
    for key, hint in hints.items():
        wrapper = te.get_origin(hint)
        if wrapper is te.Required or (wrapper is not te.NotRequired and key in td.__required_keys__):
            required.add(key)
    annotations = {}
    for key, hint in hints.items():
        inner = strict(_strip_required(hint))
        annotations[key] = te.Required[inner] if key in required else te.NotRequired[inner]
    copy.__annotations__ = annotations
    copy.__required_keys__ = frozenset(required)
    copy.__optional_keys__ = frozenset(k for k in hints if k not in required)
    copy.__pydantic_config__ = FORBID
    copy.__module__ = td.__module__
    copy.__qualname__ = td.__qualname__
    copy.__sdk_type__ = td
    return copy


def _no_member(union_name: str, members: List[Any]):
    """A union member taking what no other member takes, with an error naming what they take."""

    def refuse(value: Any) -> Any:
        named: Dict[str, set] = {}
        for m in members:
            for key in ("type", "role"):
                lit = _literal_values(getattr(m, "__annotations__", {}).get(key))
                if lit:
                    named.setdefault(key, set()).update(lit)
        if isinstance(value, dict):
            shown = json.dumps({k: value.get(k) for k in named}) if named else "an object"
        else:
            shown = _kind_of_value(value)
        raise PydanticCustomError(
            "no_member",
            "no member takes {shown}{named}",
            {
                "shown": shown,
                "named": "".join(f"; {k} is one of {sorted(map(str, v))}" for k, v in named.items()),
            },
        )

    return te.Annotated[Any, pydantic.AfterValidator(refuse)]


def _kind_of_value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "str"
    if isinstance(v, list):
        return "list"
    if isinstance(v, dict):
        return "dict"
    return "any"


def _kinds_of_type(tp: Any) -> set:
    """The JSON kinds a (strict) type takes; {"any"} when it cannot tell."""
    if te.get_origin(tp) is te.Annotated:
        meta = te.get_args(tp)[1:]
        if any(isinstance(m, Discriminator) for m in meta):
            return set().union(*(_kinds_of_type(c) for c in te.get_args(te.get_args(tp)[0])))
        if any(isinstance(m, Tag) for m in meta) or not meta:
            return _kinds_of_type(te.get_args(tp)[0])
        return {"any"}
    origin = te.get_origin(tp)
    if origin is Literal:
        return {_kind_of_value(v) for v in te.get_args(tp)}
    if origin in (Union, pytypes.UnionType):
        return set().union(*(_kinds_of_type(a) for a in te.get_args(tp)))
    if te.is_typeddict(tp) or origin is dict or tp is dict:
        return {"dict"}
    if origin is list or tp is list:
        return {"list"}
    simple = {str: "str", bool: "bool", int: "number", float: "number", type(None): "null"}
    if tp in simple:
        return {simple[tp]}
    return {"any"}


def _union(members: List[Any]) -> Any:
    """A union whose member is chosen by the value, so that an error names one member.

    The value's JSON kind picks among members of different kinds (`str` or a list of blocks); an
    object among TypedDicts is given to the member whose `Literal` fields (`type`, `role`) it
    matches, and when several match, to the first that validates, else the one with fewest
    errors. Members a kind cannot tell apart stay a plain union."""
    kinds = [_kinds_of_type(m) for m in members]
    if any("any" in k for k in kinds):
        return Union[tuple(members)]  # type: ignore[return-value]
    by_kind: Dict[str, List[Any]] = {}
    for m, ks in zip(members, kinds):
        for k in ks:
            by_kind.setdefault(k, [])
            if m not in by_kind[k]:
                by_kind[k].append(m)
    tds = by_kind.get("dict", [])
    split_dicts = len(tds) >= 2 and all(te.is_typeddict(m) for m in tds)
    choices, route = [], {}
    for kind, ms in by_kind.items():
        if kind == "dict" and split_dicts:
            continue
        tag = f"kind:{kind}"
        choices.append(te.Annotated[Union[tuple(ms)], Tag(tag)])  # type: ignore[misc]
        route[kind] = tag
    td_tags = [f"{i}:{m.__name__}" for i, m in enumerate(tds)] if split_dicts else []
    for m, t in zip(tds if split_dicts else [], td_tags):
        choices.append(te.Annotated[m, Tag(t)])
    name = "|".join(getattr(m, "__name__", str(m)) for m in members)
    choices.append(te.Annotated[_no_member(name, tds), Tag("none")])
    choices.append(te.Annotated[te.Annotated[Any, pydantic.AfterValidator(lambda v: no_fit(v))], Tag("nofit")])

    def candidates(value: dict) -> List[int]:
        out = []
        for i, m in enumerate(tds):
            ok = True
            for key, hint in m.__annotations__.items():
                lit = _literal_values(hint)
                if lit is None:
                    continue
                if key in value:
                    ok &= value[key] in lit
                elif key in ("type", "role") and key in m.__required_keys__:
                    ok = False  # the keys that name a member; a missing `status` is an error to show
            if ok:
                out.append(i)
        return out

    def pick(value: Any) -> str:
        kind = _kind_of_value(value)
        if kind != "dict" or not split_dicts:
            return route.get(kind, "none")
        found = candidates(value)
        if not found:
            return "none"
        if len(found) == 1:
            return td_tags[found[0]]
        for i in found:
            try:
                _adapter(tds[i]).validate_python(value, strict=True)
                return td_tags[i]
            except ValidationError:
                pass
        return "nofit"

    def no_fit(value: Any) -> Any:
        """Several members take the value's literals and none validates: what each refuses."""
        detail = []
        for i in candidates(value):
            try:
                _adapter(tds[i]).validate_python(value, strict=True)
            except ValidationError as e:
                errs = e.errors(include_url=False)
                detail.append(f"as {tds[i].__name__}: " + ", ".join(f"{_loc(x['loc'])}: {x['msg']}" for x in errs[:3]))
        raise PydanticCustomError("no_fit", "no member fits ({detail})", {"detail": "; ".join(detail)})

    return te.Annotated[Union[tuple(choices)], Discriminator(pick)]  # type: ignore[misc]


# What `strict` makes of a response model (or a union of them) and of the file objects the SDK
# encodes itself (`IO[bytes]`, `PathLike`): never on the wire, so left out of their unions.
_RESPONSE_ONLY = object()


def strict(tp: Any) -> Any:
    """The strict copy of a request type (see the module docs)."""
    if te.is_typeddict(tp):
        return _copy_typeddict(tp)
    origin = te.get_origin(tp)
    if _is_model(tp) or origin is typing.IO or tp is os.PathLike or origin is os.PathLike:
        return _RESPONSE_ONLY  # file objects too: the SDK turns them into base64 strings
    args = te.get_args(tp)
    if origin is te.Annotated:
        inner = strict(args[0])
        if inner is _RESPONSE_ONLY:
            return inner
        kept = [m for m in args[1:] if type(m).__name__ != "PropertyInfo"]
        return te.Annotated[(inner, *kept)] if kept else inner  # type: ignore[misc]
    if origin in (Union, pytypes.UnionType):
        members = []
        for a in args:
            s = strict(a)
            if s is _RESPONSE_ONLY:
                continue  # a response model: a client sends JSON, not the SDK's objects
            if s not in members:
                members.append(s)
        if not members:
            return _RESPONSE_ONLY
        if len(members) == 1:
            return members[0]
        if all(te.get_origin(m) is Literal or m in (str, int, float, bool, type(None)) for m in members):
            return Union[tuple(members)]  # type: ignore[return-value]  # scalars: errors are short
        return _union(members)
    if origin in (
        list,
        set,
        frozenset,
        tuple,
        collections.abc.Iterable,
        collections.abc.Sequence,
        collections.abc.Set,
    ) or (origin is not None and getattr(origin, "__name__", "") == "SequenceNotStr"):
        item = args[0] if args else Any
        return List[strict(item)]  # type: ignore[valid-type]
    if origin in (dict, collections.abc.Mapping):
        return Dict[args[0], strict(args[1])]  # type: ignore[valid-type]
    if isinstance(tp, type) and getattr(tp, "__name__", "") == "SequenceNotStr":
        return List[Any]
    return tp


# --------------------------------------------------------------------------------------------
# Providers


def _python_names(model: type, value: Any, loc: tuple) -> list:
    """The keys of `value` that are a field's Python name rather than its wire alias
    (`function_call` for `functionCall`), through the nested models.

    `by_name=False` does not reach them: `Part` has its own `__init__`, which pydantic calls with
    the keys as they are and which takes the Python names."""
    out: list = []
    if isinstance(value, list):
        for i, v in enumerate(value):
            out += _python_names(model, v, loc + (i,))
        return out
    if not isinstance(value, dict):
        return out
    for name, field in model.model_fields.items():
        alias = field.alias or name
        if name != alias and name in value:
            out.append({
                "type": PydanticCustomError("python_name", "a Python field name; the wire name is {alias}",
                                            {"alias": alias}),
                "loc": loc + (name,),
                "input": value[name],
            })
        if alias not in value:
            continue
        for inner in _models_in(field.annotation):
            out += _python_names(inner, value[alias], loc + (alias,))
    return out


def _models_in(tp: Any) -> list:
    if _is_model(tp):
        return [tp]
    return [m for a in te.get_args(tp) for m in _models_in(a)]


def _typed(tp):
    adapter = TypeAdapter(strict(tp))
    return lambda msg: adapter.validate_json(json.dumps(msg), strict=True)


def _gemini(model):
    def validate(msg):
        names = _python_names(model, msg, ())
        if names:
            raise ValidationError.from_exception_data(model.__name__, names)
        return model.model_validate_json(json.dumps(msg), strict=True, by_alias=True, by_name=False)

    return validate


def _validators():
    from anthropic.types.beta import BetaMessageParam
    from google.genai.types import Content
    from openai.types.chat import ChatCompletionMessageParam
    from openai.types.responses import ResponseInputItemParam

    return {
        "anthropic": _typed(BetaMessageParam),
        "openai": _typed(ChatCompletionMessageParam),
        "openai_responses": _typed(ResponseInputItemParam),
        "gemini": _gemini(Content),
    }


def _tool_validators():
    from anthropic.types.beta import BetaToolUnionParam
    from google.genai.types import Tool
    from openai.types.chat import ChatCompletionToolUnionParam
    from openai.types.responses import ToolParam

    return {
        "anthropic": _typed(BetaToolUnionParam),
        "openai": _typed(ChatCompletionToolUnionParam),
        "openai_responses": _typed(ToolParam),
        "gemini": _gemini(Tool),
    }


def _loc(loc) -> str:
    """`content[1]<BetaTextBlockParam>.bogus`: the union members the value was taken for in <>."""
    parts = []
    for p in loc:
        p = str(p) if not isinstance(p, int) else p
        if isinstance(p, int):
            parts.append(f"[{p}]")
        elif p.startswith("kind:") or p in ("none", "nofit"):
            continue  # a union's branch by JSON kind: the value shows it
        elif ":" in p and p.split(":", 1)[0].isdigit():
            parts.append(f"<{p.split(':', 1)[1]}>")
        else:
            parts.append(("." if parts else "") + p)
    return "".join(parts) or "(message)"


def _errors(e: ValidationError) -> List[str]:
    out = []
    for err in e.errors(include_url=False)[:MAX_ERRORS]:
        shown = json.dumps(err.get("input"), default=str)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        out.append(f"{_loc(err['loc'])}: {err['msg']} (input {shown})")
    if e.error_count() > MAX_ERRORS:
        out.append(f"... {e.error_count() - MAX_ERRORS} more")
    return out


def _refusal(validate, msg) -> List[str]:
    """Why `validate` refuses `msg` (nothing when it passes)."""
    try:
        validate(msg)
    except ValidationError as e:
        return _errors(e)
    except (AttributeError, TypeError, ValueError) as e:
        # An SDK's own code can fail on a value of the wrong kind before pydantic reports it
        # (google-genai's enums call `.upper()` on whatever they are given).
        return [f"{type(e).__name__}: {e}"]
    return []


def check(cases: list) -> dict:
    """Each failure names the message's index, or for a tool `"tools[i]"`."""
    validators = _validators()
    tool_validators = _tool_validators() if any(case.get("tools") for case in cases) else {}
    checked, failures = 0, []
    for case in cases:
        name, provider = case.get("name", "?"), case.get("provider")
        validate = validators.get(provider)
        if validate is None:
            failures.append({"name": name, "index": None, "errors": [f"unknown provider {provider!r}"]})
            continue
        for index, msg in enumerate(case.get("messages", [])):
            checked += 1
            errors = _refusal(validate, msg)
            if errors:
                failures.append({"name": name, "index": index, "errors": errors})
        for index, tool in enumerate(case.get("tools") or []):
            checked += 1
            errors = _refusal(tool_validators[provider], tool)
            if errors:
                failures.append({"name": name, "index": f"tools[{index}]", "errors": errors})
    return {"checked": checked, "failures": failures}


# --------------------------------------------------------------------------------------------
# Self-test: the checker refuses what it must

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def selftest() -> int:
    good_user = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "text", "text": "ok"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
            ]},
            {"type": "text", "text": "go on", "cache_control": {"type": "ephemeral"}},
        ],
    }
    good_assistant = {
        "role": "assistant",
        "content": [
            {"type": "compaction", "content": "summary"},
            {"type": "thinking", "thinking": "hm", "signature": "sig"},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"cmd": "ls"}},
        ],
    }
    good_chat = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}],
    }
    good_items = [
        {"role": "assistant", "content": "done"},
        {"type": "function_call", "call_id": "c1", "name": "Bash", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_text", "text": "ok"},
            {"type": "input_image", "image_url": "data:image/png;base64," + PNG, "detail": "auto"},
            {"type": "input_file", "file_url": "https://example.com/a.pdf"},
        ]},
    ]
    good_gemini = {
        "role": "model",
        "parts": [
            {"text": "x", "thought": True},
            {"functionCall": {"name": "Bash", "args": {"cmd": "ls"}}, "thoughtSignature": "c2ln"},
            {"inlineData": {"mimeType": "image/png", "data": PNG}},
            {"fileData": {"mimeType": "application/pdf", "fileUri": "https://example.com/a.pdf"}},
        ],
    }
    good_gemini_fr = {
        "role": "user",
        "parts": [{"functionResponse": {"name": "Read", "response": {"output": "ok"}, "parts": [
            {"inlineData": {"mimeType": "image/png", "data": PNG}}]}}],
    }

    def nested(msg, path, value):
        msg = json.loads(json.dumps(msg))
        target = msg
        for p in path[:-1]:
            target = target[p]
        target[path[-1]] = value
        return msg

    expect = [
        # (what, provider, message, should pass)
        ("anthropic good user", "anthropic", good_user, True),
        ("anthropic good assistant", "anthropic", good_assistant, True),
        ("anthropic unknown key on a block", "anthropic",
         nested(good_user, ["content", 1, "bogus"], 1), False),
        ("anthropic unknown key three levels down (tool_result > image > source)", "anthropic",
         nested(good_user, ["content", 0, "content", 1, "source", "bogus"], 1), False),
        ("anthropic unknown key on the message", "anthropic", nested(good_user, ["bogus"], 1), False),
        ("anthropic tool_use.input not an object", "anthropic",
         nested(good_assistant, ["content", 2, "input"], "ls"), False),
        ("anthropic wrong shape inside an Iterable (text: 3)", "anthropic",
         nested(good_user, ["content", 0, "content", 0, "text"], 3), False),
        ("anthropic unknown block type", "anthropic",
         nested(good_user, ["content", 1], {"type": "future_block", "x": 1}), False),
        ("anthropic thinking without signature", "anthropic",
         nested(good_assistant, ["content", 1], {"type": "thinking", "thinking": "hm"}), False),
        ("openai good assistant", "openai", good_chat, True),
        ("openai unknown key in function", "openai",
         nested(good_chat, ["tool_calls", 0, "function", "bogus"], 1), False),
        ("openai tool content not text", "openai",
         {"role": "tool", "tool_call_id": "c", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, False),
        ("openai arguments not a string", "openai",
         nested(good_chat, ["tool_calls", 0, "function", "arguments"], {}), False),
        *[(f"responses good item {i}", "openai_responses", it, True) for i, it in enumerate(good_items)],
        ("responses unknown key in input_image", "openai_responses",
         nested(good_items[2], ["output", 1, "bogus"], 1), False),
        ("responses assistant output_text without id/status", "openai_responses",
         {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x", "annotations": []}]}, False),
        ("responses output not str/list", "openai_responses", nested(good_items[2], ["output"], 3), False),
        ("gemini good model", "gemini", good_gemini, True),
        ("gemini good functionResponse with parts", "gemini", good_gemini_fr, True),
        ("gemini snake_case key", "gemini",
         {"role": "model", "parts": [{"function_call": {"name": "Bash", "args": {}}}]}, False),
        ("gemini unknown key in a part", "gemini", nested(good_gemini, ["parts", 0, "bogus"], 1), False),
        ("gemini unknown key in fileData", "gemini",
         nested(good_gemini, ["parts", 3, "fileData", "url"], "x"), False),
        ("gemini code language not text", "gemini",
         {"role": "model", "parts": [{"executableCode": {"language": ["PYTHON"], "code": "x"}}]}, False),
        ("gemini parts not a list", "gemini", {"role": "user", "parts": {"text": "x"}}, False),
        ("gemini data not base64", "gemini",
         {"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": "not base64!"}}]}, False),
    ]
    schema = {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
              "required": ["query"]}
    responses_tool = {"type": "function", "name": "search", "description": "d", "parameters": schema,
                      "strict": False}
    tool_expect = [
        ("anthropic good tool", "anthropic", {"name": "search", "description": "d", "input_schema": schema}, True),
        ("anthropic tool without input_schema", "anthropic", {"name": "search", "description": "d"}, False),
        ("chat good tool", "openai",
         {"type": "function", "function": {"name": "search", "description": "d", "parameters": schema}}, True),
        ("chat tool with an unknown key", "openai",
         {"type": "function", "function": {"name": "search", "parameters": schema}, "bogus": 1}, False),
        ("responses good tool", "openai_responses", responses_tool, True),
        ("responses function tool without strict", "openai_responses",
         {k: v for k, v in responses_tool.items() if k != "strict"}, False),
        ("responses tool in Chat's shape", "openai_responses",
         {"type": "function", "function": {"name": "search", "parameters": schema}}, False),
        ("gemini good tool", "gemini",
         {"functionDeclarations": [{"name": "search", "description": "d", "parameters": schema}]}, True),
        ("gemini snake_case tool key", "gemini",
         {"function_declarations": [{"name": "search", "parameters": schema}]}, False),
    ]
    validators, tool_validators = _validators(), _tool_validators()
    expect = [(what, provider, msg, should_pass, validators) for what, provider, msg, should_pass in expect]
    expect += [(what, provider, tool, should_pass, tool_validators)
               for what, provider, tool, should_pass in tool_expect]
    bad = 0
    for what, provider, msg, should_pass, chosen in expect:
        errors = _refusal(chosen[provider], msg)
        passed, detail = not errors, (errors or [""])[0]
        ok = passed == should_pass
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}: {'passes' if passed else 'refused: ' + detail}")
    print(f"selftest: {len(expect) - bad} passed, {bad} failed")
    return 1 if bad else 0


def main() -> int:
    if "--selftest" in sys.argv[1:]:
        return selftest()
    cases = json.load(sys.stdin)
    summary = check(cases)
    json.dump(summary, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
