"""Finding and loading libdeltacast.so, and the C prototypes the binding calls.

Rules:
  - Search order (the first path that exists is loaded; one that exists but fails to load is an
    error, never a reason to try the next one):
      1. $DELTACAST_LIB, a path (when set, nothing else is searched);
      2. an installed prefix P, the package being P/lib/python3*/{dist,site}-packages/deltacast:
         P/lib/libdeltacast.so*, then P/lib/<multiarch>/libdeltacast.so*, then P/lib/*/...;
      3. the source tree, the package being REPO/python/deltacast: REPO/build/capi/libdeltacast.so;
      4. ctypes.util.find_library("deltacast") (ldconfig's cache, LD_LIBRARY_PATH).
  - The library's major version must equal EXPECTED_MAJOR.
  - Every function called from Python has its argtypes and restype declared here.
  - ctypes.CDLL releases the GIL for the duration of every foreign call: other Python threads run
    while a call blocks (join, start, refit, wait_version), and deltacast's own threads can take the
    GIL to run an event callback. dc_last_error() is per thread, so it is read on the thread that
    made the failing call, right after it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sysconfig

EXPECTED_MAJOR = 0
LIBRARY_NAME = "libdeltacast.so"

# void (*dc_event_callback)(void* user, int kind, uint64_t version, int status, const char* message)
EVENT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int,
                                  ctypes.c_char_p)

_c_int_p = ctypes.POINTER(ctypes.c_int)
_c_size_p = ctypes.POINTER(ctypes.c_size_t)
_c_uint64_p = ctypes.POINTER(ctypes.c_uint64)
_c_int64_p = ctypes.POINTER(ctypes.c_int64)
_c_char_pp = ctypes.POINTER(ctypes.c_char_p)
_c_void_pp = ctypes.POINTER(ctypes.c_void_p)
_h = ctypes.c_void_p  # every opaque handle (dc_receiver*, dc_producer*)
_i = ctypes.c_int

# name: (restype, argtypes). Only functions the binding calls (a missing symbol fails the load).
PROTOTYPES = {
    "dc_version_number": (ctypes.c_uint, []),
    "dc_version_string": (ctypes.c_char_p, []),
    "dc_status_name": (ctypes.c_char_p, [_i]),
    "dc_last_error": (ctypes.c_char_p, []),
    "dc_dtype_name": (ctypes.c_char_p, [_i]),
    "dc_dtype_size": (ctypes.c_size_t, [_i]),
    "dc_receiver_create": (_i, [_c_void_pp]),
    "dc_receiver_free": (None, [_h]),
    "dc_receiver_set": (_i, [_h, ctypes.c_char_p, ctypes.c_char_p]),
    "dc_receiver_join": (_i, [_h, ctypes.c_int64]),
    "dc_receiver_tensor_count": (_i, [_h, _c_size_p]),
    "dc_receiver_tensor": (_i, [_h, ctypes.c_size_t, _c_char_pp, _c_int_p, _c_int_p, _c_int64_p, _i]),
    "dc_receiver_attach": (_i, [_h, ctypes.c_char_p, _i, _i, _c_int64_p, ctypes.c_void_p, ctypes.c_size_t, _i,
                                _i]),
    "dc_receiver_place": (_i, [_h, ctypes.c_char_p]),
    "dc_receiver_start": (_i, [_h]),
    "dc_receiver_version": (_i, [_h, _c_uint64_p, _c_uint64_p]),
    "dc_receiver_wait_version": (_i, [_h, ctypes.c_uint64, ctypes.c_int64]),
    "dc_receiver_pending": (_i, [_h, _c_uint64_p, _c_size_p]),
    "dc_receiver_apply": (_i, [_h, _c_uint64_p]),
    "dc_receiver_reattach": (_i, [_h, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t, _i, _i]),
    "dc_receiver_set_event_callback": (_i, [_h, EVENT_CALLBACK, ctypes.c_void_p]),
    "dc_receiver_poll_event": (_i, [_h, _c_int_p, _c_uint64_p, _c_int_p, _c_char_pp]),
    "dc_producer_create": (_i, [_c_void_pp]),
    "dc_producer_free": (None, [_h]),
    "dc_producer_set": (_i, [_h, ctypes.c_char_p, ctypes.c_char_p]),
    "dc_producer_add_tensor": (_i, [_h, ctypes.c_char_p, _i, _i, _c_int64_p, ctypes.c_void_p, ctypes.c_size_t,
                                    _i, _i]),
    "dc_producer_listen": (_i, [_h]),
    "dc_producer_url": (_i, [_h, _c_char_pp]),
    "dc_producer_start": (_i, [_h, ctypes.c_int64]),
    "dc_producer_set_data": (_i, [_h, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]),
    "dc_producer_refit": (_i, [_h, _i]),
    "dc_producer_report": (_i, [_h, _c_char_pp]),
    "dc_producer_version": (_i, [_h, _c_uint64_p]),
}


class LibraryNotFoundError(ImportError):
    """libdeltacast.so was not found, could not be loaded, or has the wrong major version."""


def _sorted_matches(directory):
    """libdeltacast.so* in `directory`: the plain name first, then the SONAME, then longer ones."""
    found = glob.glob(os.path.join(glob.escape(directory), LIBRARY_NAME + "*"))
    return sorted((p for p in found if os.path.isfile(p)), key=lambda p: (len(os.path.basename(p)), p))


def _installed_lib_dir(package_dir):
    """P/lib for a package installed as P/lib/python3*/{dist,site}-packages/deltacast, else None."""
    site_dir = os.path.dirname(package_dir)
    python_dir = os.path.dirname(site_dir)
    if os.path.basename(site_dir) in ("dist-packages", "site-packages") and \
            os.path.basename(python_dir).startswith("python"):
        return os.path.dirname(python_dir)
    return None


def search_plan(package_dir=None, environ=None):
    """The places searched, in order, as (description, [paths that exist]) pairs.

    The explicit path from DELTACAST_LIB is listed even when it does not exist (it is then an
    error, not a reason to look elsewhere). Exposed for tests and for the not-found message."""
    environ = os.environ if environ is None else environ
    package_dir = os.path.dirname(os.path.abspath(__file__)) if package_dir is None else package_dir
    explicit = environ.get("DELTACAST_LIB")
    if explicit:
        return [("$DELTACAST_LIB=" + explicit, [explicit])]
    plan = []
    lib_dir = _installed_lib_dir(package_dir)
    if lib_dir is not None:
        multiarch = sysconfig.get_config_var("MULTIARCH")
        subdirs = sorted(d for d in glob.glob(os.path.join(glob.escape(lib_dir), "*")) if os.path.isdir(d))
        if multiarch:
            preferred = os.path.join(lib_dir, multiarch)
            subdirs.sort(key=lambda d: d != preferred)
        paths = _sorted_matches(lib_dir)
        for d in subdirs:
            paths += _sorted_matches(d)
        plan.append((f"{lib_dir}/{LIBRARY_NAME}* and {lib_dir}/*/{LIBRARY_NAME}*", paths))
    repo = os.path.dirname(os.path.dirname(package_dir))
    in_tree = os.path.join(repo, "build", "capi", LIBRARY_NAME)
    plan.append((in_tree, [in_tree] if os.path.isfile(in_tree) else []))
    by_name = ctypes.util.find_library("deltacast")
    plan.append((f"ctypes.util.find_library('deltacast') -> {by_name}", [by_name] if by_name else []))
    return plan


def _declare(lib):
    for name, (restype, argtypes) in PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as exc:
            raise LibraryNotFoundError(f"deltacast: {lib._name} lacks {name}(): it is not the deltacast C API "
                                       f"this binding expects") from exc
        fn.restype = restype
        fn.argtypes = argtypes


def load(package_dir=None, environ=None):
    """Loads the library by the search order above; returns (CDLL, path)."""
    plan = search_plan(package_dir, environ)
    for _, paths in plan:
        for path in paths:
            try:
                lib = ctypes.CDLL(path)
            except OSError as exc:
                raise LibraryNotFoundError(f"deltacast: cannot load {path}: {exc}") from exc
            _declare(lib)
            # libdeltacast.so is a shim over deltacast/libdeltacast_core.so.X.Y.Z beside it: without
            # its core it answers "" here and dc_last_error() says what it tried.
            if not lib.dc_version_string():
                raise LibraryNotFoundError(f"deltacast: {path} is unusable: {lib.dc_last_error().decode()}")
            number = lib.dc_version_number()
            if number // 10000 != EXPECTED_MAJOR:
                raise LibraryNotFoundError(
                    f"deltacast: {path} is version {lib.dc_version_string().decode()} (major {number // 10000}); "
                    f"this binding needs major {EXPECTED_MAJOR}")
            return lib, path
    looked = "\n  ".join(description for description, _ in plan)
    raise LibraryNotFoundError(
        f"deltacast: cannot find {LIBRARY_NAME}. Looked in, in order:\n  {looked}\n"
        f"Build it (cmake --build build --target deltacast_shared) or set DELTACAST_LIB to its path.")
