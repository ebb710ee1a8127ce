"""A checkpoint's chat template, rendered with jinja2 as transformers' ``apply_chat_template``
renders it (transformers 5.17 ``utils/chat_template_utils.py`` and
``tokenization_utils_base.py``), so a prompt memra builds is the one transformers would build:

- the template: ``chat_template.jinja`` in the folder, else ``tokenizer_config.json``'s
  ``chat_template`` (a string, or a list of ``{"name", "template"}`` of which "default" is used,
  and "tool_use" when ``tools`` are given, as is ``additional_chat_templates/tool_use.jinja``);
- a jinja2 ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks`` on, the
  ``loopcontrols`` extension, a ``{% generation %}`` block tag (rendered as its body), the
  ``tojson`` filter without HTML escaping, and the globals ``raise_exception`` and
  ``strftime_now``;
- the variables ``messages``, ``tools`` and ``documents`` (None), ``add_generation_prompt``,
  the tokenizer config's named special tokens as strings (``bos_token``, ``eos_token``,
  ``unk_token``, ``sep_token``, ``pad_token``, ``cls_token``, ``mask_token``, any other
  ``*_token`` key and the entries of ``extra_special_tokens`` / ``model_specific_special_tokens``
  when they are objects; each a string or an AddedToken dict; ``special_tokens_map.json``'s
  over tokenizer_config.json's), then any extra keyword arguments (which win);
- with ``continue_final_message``, the text is cut where the last message's content ends
  (transformers' marker appended to that content and cut out after rendering), so the model
  continues that message;
- the rendered text is then tokenized without adding special tokens (the template writes them).

tests/test_serve_chat_template.py compares renderings with ones transformers made
(tests/fixtures/make_chat_template_fixtures.py).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from ..errors import ContractError
from ..config import side_file
from ..loader import naming_unreadable, read_json_file

# transformers' PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES.
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# The marker transformers appends to the content that continue_final_message continues.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _token_text(value) -> str | None:
    """A special token as the template sees it: a string, or an AddedToken's ``content``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def special_tokens(config: dict) -> dict[str, str]:
    """The named special tokens transformers hands a chat template, from tokenizer_config.json
    (or special_tokens_map.json): each a string or an AddedToken dict."""
    out: dict[str, str] = {}
    for name in SPECIAL_TOKEN_NAMES:
        text = _token_text(config.get(name))
        if text is not None:
            out[name] = text
    extra: dict[str, str] = {}
    for key, value in config.items():  # transformers' "auto model-specific" tokens
        text = _token_text(value) if key.endswith("_token") and key not in SPECIAL_TOKEN_NAMES else None
        if text is not None:
            extra[key] = text
    for key in ("extra_special_tokens", "model_specific_special_tokens"):
        if isinstance(config.get(key), dict):
            for name, value in config[key].items():
                text = _token_text(value)
                if text is not None:
                    extra[name] = text
    out.update(extra)
    return out


def _environment():
    """The jinja2 environment transformers compiles chat templates in."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` renders its body (transformers uses the
        tag to find assistant tokens; the rendered text is the same)."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def _compile(source: str):
    import jinja2

    try:
        return _environment().from_string(source)
    except jinja2.TemplateError as e:
        raise ContractError(f"chat template: does not compile: {e}", 40025) from None


class ChatTemplate:
    """A compiled chat template and the special tokens it is rendered with.

    ``source``: the template text; ``tokens``: the special tokens (see the module docstring);
    ``tool_use``: the text of a template named "tool_use", which transformers renders instead
    when ``tools`` are given. ContractError when a template does not compile (naming jinja2's
    message).
    """

    def __init__(self, source: str, tokens: dict[str, str] | None = None, *, tool_use: str | None = None) -> None:
        self.source = source
        self.tokens = dict(tokens or {})
        self._template = _compile(source)
        self._tool_use = None if tool_use is None else _compile(tool_use)

    def render(self, messages: list[dict], /, *, add_generation_prompt: bool = True,
               continue_final_message: bool = False, **kwargs) -> str:
        """The conversation as the prompt text transformers' ``apply_chat_template(messages,
        tokenize=False, add_generation_prompt=..., continue_final_message=...)`` gives (with
        ``tools=`` given, through the "tool_use" template where the checkpoint has one).
        continue_final_message: the prompt ends where the last message's content ends (the
        template's end of that message cut off), so the model continues it; found as transformers
        finds it, by a marker appended to that content and cut out of the rendered text.
        ContractError with the template's message when it refuses the conversation
        (``raise_exception``) or fails on it, and (transformers' refusals) for
        continue_final_message with add_generation_prompt, a last message without content, or
        a rendering where its content cannot be found."""
        import jinja2

        if not messages:
            raise ContractError("chat template: the conversation has no messages", 40025)
        variables = {**self.tokens, **kwargs}
        final = None
        if continue_final_message:
            messages, final = self._mark_final_message(messages, add_generation_prompt)
        try:
            # one mapping, not keywords: a variable named like render's own parameter ("self")
            # is the template's, not a second value for it
            template = self._tool_use if self._tool_use is not None and kwargs.get("tools") is not None \
                else self._template
            text = template.render({"tools": None, "documents": None, **variables,
                                          "messages": messages,
                                          "add_generation_prompt": add_generation_prompt})
        except jinja2.TemplateError as e:
            raise ContractError(f"chat template: {e}", 40025) from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            raise ContractError(f"chat template failed on this conversation: {type(e).__name__}: {e}",
                                40025) from None
        if final is None:
            return text
        if final.strip() not in text or _CONTINUE_TAG.strip() not in text:
            raise ContractError("chat template: continue_final_message is set but the final message does not "
                                "appear in the rendered chat (the template changes or drops it)", 40025)
        cut = text.rindex(_CONTINUE_TAG.strip())
        # the marker whole: the template kept the content's spacing; else it trimmed the marker's
        # trailing space, and the content's own trailing spacing with it
        return text[:cut] if text[cut:cut + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:cut].rstrip()

    def _mark_final_message(self, messages: list[dict], add_generation_prompt: bool) -> tuple[list[dict], str]:
        """`messages` with the marker appended to the last one's content (to its last text part
        when the content is a list of parts), and that content as it was."""
        if add_generation_prompt:
            raise ContractError("chat template: continue_final_message and add_generation_prompt are not "
                                "compatible (set add_generation_prompt to false)", 40025)
        last = dict(messages[-1])
        content = last.get("content")
        if content is None:
            raise ContractError('chat template: continue_final_message is set but the final message has no '
                                '"content" to continue', 40025)
        if "content" not in self.source:
            raise ContractError('chat template: continue_final_message is set but the template never reads '
                                '"content"', 40025)
        if isinstance(content, (list, tuple)):
            parts = [dict(p) if isinstance(p, dict) else p for p in content]
            j = next((j for j in reversed(range(len(parts))) if isinstance(parts[j], dict) and "text" in parts[j]),
                     None)
            if j is None:
                raise ContractError("chat template: continue_final_message is set but the final message has no "
                                    "text to continue", 40025)
            final = parts[j]["text"]
            parts[j]["text"] = final + _CONTINUE_TAG
            last["content"] = parts
        else:
            final = content
            last["content"] = content + _CONTINUE_TAG
        return [*messages[:-1], last], final


def load_chat_template(path: Path) -> ChatTemplate | None:
    """The chat template of a checkpoint folder (None when it has none): chat_template.jinja,
    else tokenizer_config.json's ``chat_template``; its special tokens from tokenizer_config.json
    and special_tokens_map.json (which wins). ContractError for a template of the wrong
    type or one that does not compile, or a file that cannot be read (each named)."""
    path = Path(path)
    config_file = path / "tokenizer_config.json"
    config = read_json_file(config_file, "chat template") if side_file(config_file, "chat template") else {}
    source = config.get("chat_template")
    jinja = path / "chat_template.jinja"
    if side_file(jinja, "chat template") is not None:
        source = _read_text(jinja)
    tool_use = None
    if isinstance(source, list):  # named templates, as transformers saves several
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source, tool_use = named.get("default"), named.get("tool_use")
        if source is None:
            raise ContractError(f"chat template: {config_file} has named templates {sorted(map(str, named))} "
                                f"but no 'default'", 40025)
    extra = path / "additional_chat_templates" / "tool_use.jinja"  # transformers 5's folder of named ones
    if side_file(extra, "chat template") is not None:
        tool_use = _read_text(extra)
    if source is None:
        return None
    for what, text in (("chat_template", source), ("the tool_use template", tool_use)):
        if text is not None and not isinstance(text, str):
            raise ContractError(f"chat template: {what} in {config_file} must be a string, got "
                                f"{type(text).__name__}", 40025)
    # special_tokens_map.json, where a checkpoint has one, names tokens over tokenizer_config's,
    # as transformers' from_pretrained reads them.
    map_file = path / "special_tokens_map.json"
    token_map = read_json_file(map_file, "chat template") if side_file(map_file, "chat template") else {}
    return ChatTemplate(source, {**special_tokens(config), **special_tokens(token_map)}, tool_use=tool_use)


def _read_text(file: Path) -> str:
    """A template file's text; ContractError naming it when it cannot be read or is not UTF-8."""
    try:
        with naming_unreadable(file, "chat template"):
            return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ContractError(f"chat template: {file} is not UTF-8 text: {e}", 40025) from None
