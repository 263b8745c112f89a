"""Output paths: checked before any work starts, written all at once.

A long simulation that ends in ``--out: not writable`` wastes the run, and one that
dies half-way through writing its folder leaves a mix of old and new files. So every
command checks its output paths first (:func:`check_output_file`,
:func:`check_output_dir`: not an input file, not a directory where a file goes, in a
writable place) and a run folder is written through :class:`RunFolder`: every file is
staged in a hidden folder beside its target and moved into place only when all of them
were written, so the folder is either complete (this run's files, an output this run
did not make removed) or untouched.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Dict, Iterable, List, Optional, Sequence


class OutputPathError(ValueError):
    """An output path is unusable; ``str`` is one line naming the argument."""


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _writable_place(path: str) -> Optional[str]:
    """``None`` when ``path`` can be created or replaced, else why not.

    Permission bits are not enough: root passes ``os.access`` on ``/proc`` and ``/sys``,
    where no file can be created, and found out only after the whole run. So the nearest
    existing folder on the way to ``path`` is asked for real: an empty hidden file is
    created there and removed at once (the same kind of file the atomic writers make).
    """
    parent = os.path.dirname(os.path.abspath(path))
    probe = parent
    while not os.path.exists(probe):  # the nearest existing ancestor is where it gets created
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    try:
        fd, tmp = tempfile.mkstemp(prefix=".rlharness-probe-", dir=probe)
    except OSError as e:
        return f"no file can be created in {probe}: {e.strerror or e}"
    os.close(fd)
    try:
        os.unlink(tmp)
    except OSError:
        pass
    return None


def user_path_error(err: OSError, internal: str, user: str) -> OSError:
    """``err`` with the user's path ``user`` in place of an internal temp or staging
    path that starts with ``internal``: a message names what the user typed."""
    name = err.filename
    if name is not None and not (isinstance(name, str) and name.startswith(internal)):
        return err
    return OSError(err.errno, err.strerror or str(err), user)


def check_output_file(path: str, arg: str, inputs: Sequence[Optional[str]] = ()) -> None:
    """``path`` (given as ``arg``) can be written and is none of ``inputs``."""
    for source in inputs:
        if source and _same_file(path, source):
            raise OutputPathError(f"{arg} {path}: is an input of this command ({source}); choose another output path")
    if os.path.isdir(path):
        raise OutputPathError(f"{arg} {path}: is a directory; give a file path")
    if os.path.exists(path) and not os.path.isfile(path):
        raise OutputPathError(f"{arg} {path}: exists and is not a regular file")
    why = _writable_place(path)
    if why:
        raise OutputPathError(f"{arg} {path}: cannot write there ({why})")


def check_output_dir(out_dir: str, names: Iterable[str], arg: str, inputs: Sequence[Optional[str]] = ()) -> None:
    """``out_dir`` can hold the files ``names`` and writing them overwrites no input."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise OutputPathError(f"{arg} {out_dir}: exists and is not a directory")
    why = _writable_place(os.path.join(out_dir, "x"))
    if why:
        raise OutputPathError(f"{arg} {out_dir}: cannot write there ({why})")
    for name in names:
        path = os.path.join(out_dir, name)
        for source in inputs:
            if source and _same_file(path, source):
                raise OutputPathError(f"{arg} {out_dir}: writing {name} there would overwrite the input file {source}")
        if os.path.lexists(path) and not os.path.isfile(path):
            raise OutputPathError(
                f"{arg} {out_dir}: {path} exists and is not a regular file (it would be replaced by an output)"
            )


class RunFolder:
    """Stage a run folder's files and move them into ``out_dir`` together.

    Usage::

        with RunFolder(out_dir, owned=("events.jsonl", "summary.txt", "timeline.png")) as run:
            write(run.path("events.jsonl"))
            ...
        # on success every staged file is in out_dir and any owned file not written
        # this time (timeline.png after --no-png) is gone; on an exception nothing moved.

    ``owned`` names every file the producer may write there: the ones not staged this time
    are stale outputs of an earlier run and are removed when the new ones land.
    """

    def __init__(self, out_dir: str, owned: Iterable[str]) -> None:
        self.out_dir = out_dir
        self.owned = tuple(owned)
        self.staged: Dict[str, str] = {}
        self._stage: Optional[str] = None
        self._created_dir = False

    def __enter__(self) -> "RunFolder":
        parent = os.path.dirname(os.path.abspath(self.out_dir))
        prefix = f".{os.path.basename(os.path.abspath(self.out_dir))}.staging-"
        try:
            os.makedirs(parent, exist_ok=True)
            self._stage = tempfile.mkdtemp(prefix=prefix, dir=parent)
        except OSError as e:
            raise user_path_error(e, os.path.join(parent, prefix), self.out_dir) from None
        return self

    def path(self, name: str) -> str:
        """Where to write ``name`` now (inside the staging folder)."""
        assert self._stage is not None and name in self.owned, name
        self.staged[name] = os.path.join(self._stage, name)
        return self.staged[name]

    def final(self, name: str) -> str:
        return os.path.join(self.out_dir, name)

    def __exit__(self, exc_type, exc, tb) -> None:
        stage = self._stage
        assert stage is not None
        try:
            if exc_type is None:
                self._commit(stage)
        except OSError as e:
            raise user_path_error(e, stage, self.out_dir) from None
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        if isinstance(exc, OSError):  # a producer's write into the staging folder failed
            swapped = user_path_error(exc, stage, self.out_dir)
            if swapped is not exc:
                raise swapped from None

    def _commit(self, stage: str) -> None:
        if not os.path.isdir(self.out_dir):
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(stage, 0o777 & ~umask)  # mkdtemp made it private; a run folder is not
            os.rename(stage, self.out_dir)  # a new folder appears whole
            return
        for name, staged in self.staged.items():
            os.replace(staged, self.final(name))
        for name in self.owned:
            if name not in self.staged and os.path.isfile(self.final(name)):
                os.unlink(self.final(name))

    @property
    def files(self) -> List[str]:
        return [self.final(name) for name in self.owned if name in self.staged]
