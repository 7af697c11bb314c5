# The test's side of a judged test (run as `python3 -I -S -c` in its own
# sandbox, apart from the candidate's). The program's functions are proxies
# here: a call sends its arguments to the candidate's process and returns the
# reply, decoded strictly into Python's own built-in types, so what the test
# compares is plain data the candidate cannot make equal to everything, and
# the pass token, which only this process holds, cannot be reached from the
# candidate's code. The verdict: exit 0 after writing the token (pass), exit
# 3 with a failure line (an assertion), exit 4 (the candidate's process went
# away: the judge asks the kernel why), anything else a crash.
import os, sys
def _tern_test():
    import builtins, json, threading, traceback
    replies, requests = 5, 6
    job = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    test, token = job["test"], job["token"]
    del job
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    verdict = os.dup(1)
    os.dup2(null, 1)
    os.close(null)
    keep = sorted({replies, requests, verdict})
    low = 3
    for fd in keep:
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1024)
    inbox = os.fdopen(replies, "rb")
    lock = threading.Lock()

    def fail(reason):
        sys.stderr.write("\n[tern-judge] fail: " + reason.replace("\n", " ") + "\n")
        sys.stderr.flush()
        os._exit(3)

    def gone():
        sys.stderr.flush()
        os._exit(4)

    class CandidateError(Exception):
        """An exception the candidate raised whose type is not a built-in one."""

    class ProtocolError(Exception):
        pass

    def enc(x, depth=0):
        if depth > 100:
            raise TypeError("argument nested deeper than 100 levels")
        t = type(x)
        if x is None or t is bool or t is int or t is float or t is str:
            return x
        d = depth + 1
        if t is list:
            return {"l": [enc(v, d) for v in x]}
        if t is tuple:
            return {"t": [enc(v, d) for v in x]}
        if t is dict:
            return {"d": [[enc(k, d), enc(v, d)] for k, v in x.items()]}
        if t is set:
            return {"s": [enc(v, d) for v in x]}
        if t is frozenset:
            return {"f": [enc(v, d) for v in x]}
        if t is bytes:
            return {"b": x.hex()}
        if t is bytearray:
            return {"B": x.hex()}
        if t is complex:
            return {"c": [x.real, x.imag]}
        raise TypeError("the judge passes only plain data to the candidate, not " + t.__name__)

    def items(body):
        if type(body) is not list:
            raise ProtocolError("a container's body is not a list")
        return body

    # Strict: only the tags above, only JSON's own types underneath, so every
    # value the test sees is a genuine int, str, list, ... built here.
    def dec(v, depth=0):
        if depth > 101:
            raise ProtocolError("nested too deep")
        t = type(v)
        if v is None or t is bool or t is int or t is float or t is str:
            return v
        if t is not dict or len(v) != 1:
            raise ProtocolError("not an encoded value")
        (tag, body), = v.items()
        d = depth + 1
        if tag == "l":
            return [dec(e, d) for e in items(body)]
        if tag == "t":
            return tuple(dec(e, d) for e in items(body))
        if tag == "d":
            out = {}
            for pair in items(body):
                if type(pair) is not list or len(pair) != 2:
                    raise ProtocolError("a dict entry is not a pair")
                out[dec(pair[0], d)] = dec(pair[1], d)
            return out
        if tag == "s":
            return {dec(e, d) for e in items(body)}
        if tag == "f":
            return frozenset(dec(e, d) for e in items(body))
        if tag in ("b", "B"):
            if type(body) is not str:
                raise ProtocolError("bytes are not hex")
            raw = bytes.fromhex(body)
            return raw if tag == "b" else bytearray(raw)
        if tag == "c":
            parts = items(body)
            if len(parts) != 2 or any(type(p) not in (int, float) for p in parts):
                raise ProtocolError("a complex is not two numbers")
            return complex(parts[0], parts[1])
        raise ProtocolError("unknown tag")

    def receive():
        line = inbox.readline()
        if not line.endswith(b"\n"):
            gone()
        try:
            message = json.loads(line)
        except ValueError:
            raise ProtocolError("a reply is not JSON") from None
        if type(message) is not dict:
            raise ProtocolError("a reply is not an object")
        return message

    def send(message):
        data = (json.dumps(message) + "\n").encode("utf-8")
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(requests, view):]
        except BrokenPipeError:
            gone()

    def proxy(name):
        def call(*args, **kwargs):
            request = {"call": name, "args": [enc(a) for a in args],
                       "kwargs": {k: enc(v) for k, v in kwargs.items()}}
            with lock:
                send(request)
                reply = receive()
            if "ret" in reply:
                result = dec(reply["ret"])
                after = reply.get("args")
                if type(after) is list and len(after) == len(args):
                    for arg, new in zip(args, after):
                        if new is None:
                            continue
                        new = dec(new)
                        if type(arg) is list and type(new) is list:
                            arg[:] = new
                        elif type(arg) is bytearray and type(new) is bytearray:
                            arg[:] = new
                        elif type(arg) in (dict, set) and type(new) is type(arg):
                            arg.clear()
                            arg.update(new)
                return result
            if "raise" in reply:
                kind, message = reply["raise"]
                cls = getattr(builtins, str(kind), None)
                if isinstance(cls, type) and issubclass(cls, Exception):
                    try:
                        error = cls(str(message))
                    except Exception:
                        error = CandidateError(f"{kind}: {message}")
                else:
                    error = CandidateError(f"{kind}: {message}")
                raise error
            if "bad" in reply:
                raise TypeError("the candidate returned a value the judge cannot compare "
                                "(only plain data: numbers, strings, lists, tuples, dicts, "
                                "sets, bytes, None): " + str(reply["bad"]))
            raise ProtocolError("an unknown reply")
        call.__name__ = call.__qualname__ = name
        return call

    try:
        manifest = receive()
    except ProtocolError as error:
        sys.stderr.write(f"[tern-judge] the candidate's process sent a bad reply: {error}\n")
        sys.stderr.flush()
        os._exit(2)
    if "fail" in manifest:
        fail(str(manifest["fail"]))
    if "names" not in manifest or type(manifest["names"]) is not dict:
        sys.stderr.write("[tern-judge] the program did not finish\n")
        sys.stderr.flush()
        os._exit(2)
    ns = {"__name__": "candidate"}
    try:
        for name, entry in manifest["names"].items():
            kind = entry[0] if type(entry) is list and entry else None
            if kind == "f":
                ns[name] = proxy(name)
            elif kind == "v":
                ns[name] = dec(entry[1])
            elif kind == "m":
                try:
                    ns[name] = __import__(str(entry[1]), fromlist=["_"])
                except Exception:
                    pass
        alias = manifest.get("candidate")
        if type(alias) is str and alias in ns:
            ns["candidate"] = ns[alias]
    except (ProtocolError, ValueError, TypeError, LookupError) as error:
        sys.stderr.write(f"[tern-judge] the candidate's process sent a bad manifest: {error}\n")
        sys.stderr.flush()
        os._exit(2)
    del manifest
    try:
        exec(compile(test, "test", "exec", dont_inherit=True), ns)
    except AssertionError as error:
        reason = str(error)
        if not reason:
            lines = test.splitlines()
            at = [f.lineno for f in traceback.extract_tb(error.__traceback__) if f.filename == "test"]
            line = lines[at[-1] - 1].strip() if at and at[-1] and at[-1] <= len(lines) else ""
            reason = "assertion failed" + (": " + line if line else "")
        fail(reason)
    except BaseException:
        try:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(2)
    sys.stderr.flush()
    os.write(verdict, token.encode())
    os._exit(0)
_tern_test()
