"""``memra generate`` and ``memra serve``, for a checkpoint folder or the embedded tiny default.

    memra generate [PATH] [--prompt TEXT | --prompt-ids 1,2,3] [--max-new-tokens N]
                   [--temperature T] [--top-k K] [--top-p P] [--seed S] [--ignore-eos]
                   [--max-len N] [--device cpu|cuda|cuda:N] [--dtype D]

prints the new text (decoded with the folder's tokenizer, memra.tokenizer.read_tokenizer, special
tokens such as the EOS that ended it left out, as the server does by default) or the new token
ids, then on stderr the time to the first token (the prompt's prefill) and the decode speed in
tokens/s after it. Ctrl-C prints the tokens drawn so far and exits with 130.

    memra serve [PATH] [--host 127.0.0.1] [--port 8000] [--device cpu|cuda|cuda:N] [--dtype D]
                [--max-batch N] [--max-len N] [--max-waiting N] [--max-request-bytes N]
                [--served-model-name NAME] [--log-level LEVEL]

serves the model over HTTP with OpenAI's API (memra.serve) until interrupted.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from . import load
from .errors import CacheFullError, MemraError
from .batch import count_arg, generation_args
from .checkpoint import default_checkpoint
from .config import read_config
from .loader import naming_unreadable
from .tokenizer import NO_TOKENIZER, encode_text, read_tokenizer

DEFAULT_PROMPT = "The quick brown fox"


def _parse_ids(text: str) -> list[int]:
    """"1,2,3" -> [1, 2, 3]; an empty item ("1,,2", a trailing comma) or a non-integer is an error."""
    try:
        return [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None


def _report(e: MemraError, args: argparse.Namespace) -> int:
    """Prints `e` as ``memra: Type (code): message`` with the parameters it names as the flags
    that set them (``max_len must`` -> ``--max-len must``, ``prompt_ids holds`` / ``prompt_ids:`` ->
    ``--prompt-ids holds`` / ``--prompt-ids:``: the library speaks of its arguments, the user typed
    flags; ``stream:``, the library call ``memra generate`` makes, -> ``generate:``); returns the
    exit status 1."""
    msg = str(e)
    if args.command == "generate":
        msg = re.sub(r"^stream: ", "generate: ", msg, count=1)
    # Only the parameter the message is about ("<op>: <param> must ..."): never a value the
    # user typed, nor a file's field ("load: generation_config.json: temperature must").
    for dest in vars(args):
        if dest not in ("command", "path"):
            flag = f"--{dest.replace('_', '-')}"
            if dest == "prompt_ids" and getattr(args, "prompt_ids", None) is None:
                flag = "--prompt (its token ids)"  # ids the tokenizer made of the text typed
            msg = re.sub(rf"^(\w+: ){dest}(?=: | (?:must|holds)\b)", rf"\g<1>{flag}", msg, count=1)
    if isinstance(e, CacheFullError):  # "prompt_ids of N tokens + M new tokens ..., beyond max_len L"
        msg = re.sub(r"^(\w+: )prompt_ids of ", r"\g<1>the prompt of ", msg, count=1)
        msg = re.sub(r", beyond max_len (\d+)$", r", beyond --max-len \1", msg, count=1)
    print(f"memra: {type(e).__name__} ({e.code}): {msg}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    """Run ``memra generate`` or ``memra serve`` with `argv` (None: sys.argv[1:]); returns the
    exit status: 0 done (serve: also stopped by SIGTERM); 1 a memra error (its class, code and
    message on stderr); 2 a usage error said before any checkpoint is read (argparse's, an empty
    PATH, a prompt that is not UTF-8 or encodes to no tokens, a folder without a tokenizer for
    --prompt, a serve flag the server would refuse); 130 interrupted (Ctrl-C; generate prints the
    tokens drawn so far)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # while loading, or serve's start: no traceback for a Ctrl-C
        print("memra: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `memra generate | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: list[str] | None) -> int:
    from . import __version__

    parser = argparse.ArgumentParser(prog="memra", description="memra: hybrid linear-attention inference")
    parser.add_argument("--version", action="version", version=f"memra {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate tokens after a prompt")
    g.add_argument("path", nargs="?", default=None,
                   help="Hugging Face checkpoint folder (default: the embedded tiny glm5_next)")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--prompt", default=None, help=f"prompt text (default: {DEFAULT_PROMPT!r})")
    src.add_argument("--prompt-ids", type=_parse_ids, default=None, help="prompt token ids, e.g. 1,2,3")
    g.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate at most (default: 32)")
    g.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy, which ignores --top-k, --top-p and --seed (default: 0)")
    g.add_argument("--top-k", type=int, default=None, help="keep the k likeliest tokens (0, or the flag left out: all)")
    g.add_argument("--top-p", type=float, default=None, help="nucleus mass kept (1, or the flag left out: all)")
    g.add_argument("--seed", type=int, default=0, help="the sampler's seed (default: 0)")
    g.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-sequence token")
    g.add_argument("--max-len", type=int, default=4096,
                   help="cache length in tokens, prompt + new (default: 4096)")
    g.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    g.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                   help="compute dtype (default: float32 on the CPU, bfloat16 on CUDA)")
    _serve_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)

    if args.path == "":
        print("memra: PATH must name a checkpoint folder (leave it out for the embedded tiny model)",
              file=sys.stderr)
        return 2
    path = args.path if args.path is not None else default_checkpoint()
    if args.prompt is not None:
        try:
            args.prompt.encode("utf-8")
        except UnicodeEncodeError as e:  # undecodable argv bytes arrive as lone surrogates
            print(f"memra: --prompt is not valid UTF-8 (at character {e.start})", file=sys.stderr)
            return 2
    try:
        # The sampling arguments before the checkpoint: a bad one costs no load.
        generation_args(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed)
        if 1 <= args.max_len < args.max_new_tokens:  # any prompt takes a row: cannot fit
            raise CacheFullError(f"generate: {args.max_new_tokens} new tokens and a prompt need more than "
                                 f"--max-len {args.max_len} cache rows", 30002)
        # The prompt's tokens before the checkpoint too (load reads the same tokenizer); a path
        # that is no checkpoint folder is load's to name.
        tok, ids = None, args.prompt_ids
        if ids is None and os.path.isfile(os.path.join(path, "config.json")):
            with naming_unreadable(Path(path) / "config.json"):  # a model memra cannot run: said first
                read_config(Path(path))
            text = args.prompt if args.prompt is not None else DEFAULT_PROMPT
            tok = read_tokenizer(Path(path))
            if tok is None:
                print(f"memra: this checkpoint has {NO_TOKENIZER}; use --prompt-ids", file=sys.stderr)
                return 2
            ids = encode_text(tok, text, "--prompt", add_special_tokens=False)
            if not ids:
                print(f"memra: --prompt {text!r} encodes to no tokens; give a non-empty prompt", file=sys.stderr)
                return 2
        model = load(path, device=args.device, max_batch=1, max_len=args.max_len, dtype=args.dtype,
                     progress=True)
        print(f"memra: cache of {model.cache.max_batch} x {model.cache.max_len} tokens takes "
              f"{model.cache.nbytes / 2**20:.1f} MiB", file=sys.stderr)
        start = time.perf_counter()
        first = None  # when the first token arrived: the prompt's prefill and one draw
        new: list[int] = []
        try:
            for t in model.stream(ids, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                                  top_p=args.top_p, seed=args.seed, ignore_eos=args.ignore_eos):
                new.append(t)
                if first is None:
                    first = time.perf_counter()
        except KeyboardInterrupt:  # the stream gave its slot back; show what was drawn
            _print_new(new, tok, args)
            print(f"memra: interrupted after {len(new)} tokens", file=sys.stderr)
            return 130
        end = time.perf_counter()
    except MemraError as e:
        return _report(e, args)
    _print_new(new, tok, args)
    if first is None:
        print(f"memra: no tokens (prompt {len(ids)} tokens)", file=sys.stderr)
        return 0
    rest = len(new) - 1
    head = (f"memra: {len(new)} token{'s' if len(new) > 1 else ''}: the first {first - start:.3f} s after "
            f"the call (prompt {len(ids)} tokens)")
    if rest == 0:  # no decode step: no rate to give
        print(head, file=sys.stderr)
        return 0
    rate = rest / (end - first) if end > first else float("inf")
    print(f"{head}, then {rest} in {end - first:.3f} s ({rate:.1f} tokens/s)", file=sys.stderr)
    return 0


def _print_new(new: list[int], tok, args) -> None:
    """The new tokens on stdout: text through the tokenizer for a text prompt, else the ids."""
    if tok is not None:  # special tokens (the EOS that ended it) give no text, as the server's default
        print(tok.decode(new, skip_special_tokens=True))
    else:
        print(",".join(str(t) for t in new))


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _port(text: str) -> int:
    """A TCP port, 0-65535 (0: the system picks a free one): refused here, before the model
    loads, rather than by the socket's bind after it."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number in 0-65535, got {text!r}")
    return value


def _serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="serve the model over HTTP with OpenAI's API (continuous batching)")
    s.add_argument("path", nargs="?", default=None,
                   help="Hugging Face checkpoint folder (default: the embedded tiny glm5_next)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    s.add_argument("--port", type=_port, default=8000, help="port to listen on (default: 8000)")
    s.add_argument("--device", default=None,
                   help="cpu, cuda or cuda:N (default: cuda when memra.cuda_available(), else cpu)")
    s.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                   help="compute dtype (default: float32 on the CPU, bfloat16 on CUDA)")
    s.add_argument("--max-batch", type=_positive, default=16,
                   help="cache slots: requests decoded together (default: 16)")
    s.add_argument("--max-len", type=_positive, default=4096,
                   help="tokens per slot: prompt + max_tokens of a request (default: 4096)")
    s.add_argument("--max-waiting", type=int, default=64,
                   help="requests queued beyond the free slots before a 429 (default: 64)")
    s.add_argument("--max-request-bytes", type=_positive, default=None,
                   help="largest request body taken, 413 past it (default: 1 MiB + 64 bytes per --max-len token)")
    s.add_argument("--served-model-name", default=None,
                   help="the model id clients name (default: the checkpoint folder's name)")
    s.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="the server's and uvicorn's logging level (default: info)")


def _serve(args) -> int:
    from . import cuda_available

    try:
        from .serve import run
        from .serve.chat_template import load_chat_template
    except ImportError as e:  # fastapi / uvicorn missing from a hand-made environment
        print(f"memra: memra serve needs fastapi, uvicorn, prometheus-client and jinja2: {e}", file=sys.stderr)
        return 2
    problem = _serve_problem(args)
    if problem:  # before the load: a bad flag costs no minutes of reading weights
        print(f"memra: {problem}", file=sys.stderr)
        return 2
    device = args.device or ("cuda" if cuda_available() else "cpu")
    path = args.path if args.path is not None else default_checkpoint()
    # SIGTERM stops memra serve with status 0, during the load too. uvicorn shuts down cleanly
    # on it and then raises it again for whoever handled it before: this handler, not the
    # default one that would end the process with 143.
    main_thread = threading.current_thread() is threading.main_thread()  # signal.signal's rule
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        try:
            if os.path.isdir(path):  # the chat template before the weights (create_app reads it again)
                load_chat_template(Path(path))
            model = load(path, device=device, max_batch=args.max_batch, max_len=args.max_len, dtype=args.dtype,
                         progress=True)
        except _Terminated:
            print("memra: stopped while loading", file=sys.stderr)
            return 0
        host = f"[{args.host}]" if ":" in args.host else args.host  # an IPv6 literal
        where = f"http://{host}:{args.port}/v1" if args.port else f"http://{host} on a free port (uvicorn names it)"
        print(f"memra: serving {path} on {device} at {where} ({args.max_batch} slots x {args.max_len} tokens)",
              file=sys.stderr)
        run(model, host=args.host, port=args.port, served_model_name=args.served_model_name,
            max_waiting=args.max_waiting, max_request_bytes=args.max_request_bytes, log_level=args.log_level)
    except _Terminated:
        return 0
    except MemraError as e:  # the load, or made before serving: a chat template that does not compile, ...
        return _report(e, args)
    finally:
        # After a SIGTERM the handler stays what _terminated left (ignore): one more arriving
        # before the process ends must not kill it with 143.
        if main_thread and signal.getsignal(signal.SIGTERM) is _terminated:
            signal.signal(signal.SIGTERM, previous)
    return 0


class _Terminated(BaseException):
    """SIGTERM reached memra serve (its server has stopped by then, or it was loading). A
    BaseException, as KeyboardInterrupt is: the load's own ``except Exception`` clauses (a
    tokenizer or safetensors file that cannot be read) must not take it for their error."""


def _terminated(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the stop has begun: later ones change nothing
    raise _Terminated


def _serve_problem(args) -> str | None:
    """What create_app / run / the socket would refuse after the model loaded, said first: the
    path, the counts, the served name, a host that does not resolve, a port taken."""
    if args.path == "":
        return "PATH must name a checkpoint folder (leave it out for the embedded tiny model)"
    try:  # load's and create_app's bounds, by their own checker
        count_arg(args.max_batch, "--max-batch", 1)
        count_arg(args.max_len, "--max-len", 1)
        count_arg(args.max_waiting, "--max-waiting", 0)
        if args.max_request_bytes is not None:
            count_arg(args.max_request_bytes, "--max-request-bytes", 1, 2**63 - 1)
    except MemraError as e:
        return str(e)
    if args.served_model_name == "":
        return "--served-model-name must not be empty (leave it out for the folder's name)"
    if not args.host:
        return "--host must not be empty"
    return _listen_problem(args.host, args.port)


def _listen_problem(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port (a name that does not resolve, a port
    taken), or None; a test bind, released at once."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        return f"--host {host!r} does not resolve to an address: {e}"
    if port:  # port 0: the system picks a free one
        family, kind, proto, _, addr = infos[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds it
            try:
                s.bind(addr)
            except OSError as e:
                return f"--host {host} --port {port}: cannot listen there: {e.strerror}"
    return None


if __name__ == "__main__":
    sys.exit(main())
