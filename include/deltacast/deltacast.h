/*
 * deltacast C API: embed a relay-tree producer (trainer side) or receiver (server side) in your
 * own process. Stable C ABI, modelled on zstd.h:
 *   - every name starts with dc_ / DC_;
 *   - opaque handles with create/free (free accepts NULL);
 *   - every entry point returns an int status (DC_OK = 0, negative = error) and never lets a C++
 *     exception out; dc_last_error() holds the message of the calling thread's last error;
 *   - settings go through setters by key (the YAML keys of docs/config.md), so structs never grow.
 *
 * Life cycle and threading rules: docs/embedding.md.
 *
 *   Receiver (a server):                        Producer (a trainer):
 *     dc_receiver_create(&r)                      dc_producer_create(&p)
 *     dc_receiver_set(r, "producer", url) ...     dc_producer_set(p, "receivers", "3") ...
 *     dc_receiver_join(r, timeout_ms)             dc_producer_add_tensor(p, ...) per tensor
 *     dc_receiver_tensor(r, i, ...) per tensor    dc_producer_start(p, timeout_ms)  (version 1)
 *     dc_receiver_attach(r, ...) per tensor       dc_producer_set_data(p, name, ptr) ...
 *     dc_receiver_start(r)                        dc_producer_refit(p, dry_run)
 *     dc_receiver_wait_version(r, v, timeout)     dc_producer_report(p)  (JSON)
 *     dc_receiver_apply(r, &v)  (gated only)
 *     dc_receiver_free(r)                         dc_producer_free(p)
 *
 * Buffers are borrowed: deltacast writes refits into the receiver's registered memory in place,
 * never reallocates it and keeps no shadow copy. They must stay valid until dc_receiver_free().
 */
#ifndef DELTACAST_DELTACAST_H
#define DELTACAST_DELTACAST_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DC_API __attribute__((visibility("default")))
#else
#define DC_API
#endif

/* ---- versions ---------------------------------------------------------------------------- */
#define DC_VERSION_MAJOR 0
#define DC_VERSION_MINOR 2
#define DC_VERSION_PATCH 0
#define DC_VERSION_NUMBER (DC_VERSION_MAJOR * 10000 + DC_VERSION_MINOR * 100 + DC_VERSION_PATCH)

/* The library's DC_VERSION_NUMBER (compare with the header's to detect a mismatch). */
DC_API unsigned dc_version_number(void);
/* "MAJOR.MINOR.PATCH". */
DC_API const char* dc_version_string(void);

/* ---- status ------------------------------------------------------------------------------ */
typedef enum dc_status {
  DC_OK = 0,
  DC_PENDING = 1,                  /* nothing yet (dc_receiver_poll_event: no event queued) */
  DC_ERR_INVALID_ARGUMENT = -1,    /* a NULL handle or pointer, a bad key or value, a wrong buffer */
  DC_ERR_STATE = -2,               /* a call in the wrong state (attach after start, refit before start) */
  DC_ERR_UNSUPPORTED = -3,         /* not offered by this build (CUDA memory, a dtype the codec lacks) */
  DC_ERR_CONFIG = -4,              /* a bad option value or config file (the message names the key) */
  DC_ERR_NOT_FOUND = -5,           /* an unknown tensor name, a missing file */
  DC_ERR_CONNECTION = -6,          /* a peer unreachable, closed or reset */
  DC_ERR_TIMEOUT = -7,             /* a bound on waiting expired */
  DC_ERR_AUTH = -8,                /* a peer failed authentication (secret_file) */
  DC_ERR_CORRUPT = -9,             /* bytes failed a checksum, magic, bounds or structure check */
  DC_ERR_VERSION_MISMATCH = -10,   /* wrong base version or manifest */
  DC_ERR_VERIFY_FAILED = -11,      /* bits differ from the producer's (digest mismatch) */
  DC_ERR_REPLAYED = -12,           /* a chunk already applied in this version */
  DC_ERR_ABORTED = -13,            /* the version was aborted (receivers rolled back) */
  DC_ERR_IO = -14,                 /* a file system or OS call failed */
  DC_ERR_CANCELLED = -15,          /* the operation was cancelled (the handle is closing) */
  DC_ERR_NO_MEMORY = -16,          /* an allocation failed */
  DC_ERR_INTERNAL = -17            /* an unexpected failure (a bug or a failing dependency) */
} dc_status;

/* 1 when `status` is an error (negative), 0 otherwise. */
DC_API int dc_is_error(int status);
/* "DC_OK", "DC_ERR_TIMEOUT", ...; "DC_UNKNOWN_STATUS" for values outside the enum. Static storage. */
DC_API const char* dc_status_name(int status);
/* The message of the calling thread's last failed call ("" when none). Valid until the thread's
 * next dc_ call. */
DC_API const char* dc_last_error(void);

/* ---- tensors ----------------------------------------------------------------------------- */
/* The 15 safetensors dtypes. The codec handles BF16, F16, F32, F8_E4M3, F8_E5M2, I8 and U8
 * today; the others are refused with DC_ERR_UNSUPPORTED until it gains them. */
typedef enum dc_dtype {
  DC_DTYPE_BOOL = 0,
  DC_DTYPE_U8 = 1,
  DC_DTYPE_I8 = 2,
  DC_DTYPE_I16 = 3,
  DC_DTYPE_U16 = 4,
  DC_DTYPE_I32 = 5,
  DC_DTYPE_U32 = 6,
  DC_DTYPE_I64 = 7,
  DC_DTYPE_U64 = 8,
  DC_DTYPE_F16 = 9,
  DC_DTYPE_BF16 = 10,
  DC_DTYPE_F32 = 11,
  DC_DTYPE_F64 = 12,
  DC_DTYPE_F8_E4M3 = 13,
  DC_DTYPE_F8_E5M2 = 14
} dc_dtype;

/* "BF16", "F32", ... (the safetensors spelling); NULL for an unknown value. */
DC_API const char* dc_dtype_name(int dtype);
/* Parses the safetensors spelling into *dtype. DC_ERR_INVALID_ARGUMENT when unknown. */
DC_API int dc_dtype_from_name(const char* name, int* dtype);
/* Bytes per element (1, 2, 4 or 8); 0 for an unknown value. */
DC_API size_t dc_dtype_size(int dtype);

typedef enum dc_device {
  DC_DEVICE_HOST = 0,
  DC_DEVICE_CUDA = 1 /* CUDA device memory (device_id: the CUDA device; one per handle), served through
                        a pinned host mirror (docs/embedding.md, "CUDA buffers"). DC_ERR_UNSUPPORTED
                        when the library was built without CUDA or no device is usable; reattach of
                        CUDA tensors is DC_ERR_UNSUPPORTED */
} dc_device;

/* ---- receiver ---------------------------------------------------------------------------- */
typedef struct dc_receiver dc_receiver;

/* Creates a receiver with default options into *out. */
DC_API int dc_receiver_create(dc_receiver** out);
/* Leaves (closes its links; the producer repairs the tree around it), stops deltacast's threads
 * and frees. The registered buffers keep the last committed version. NULL is accepted. No other
 * call on this receiver may be running or start (a thread blocked in dc_receiver_wait_version
 * must have returned): free is the last call. */
DC_API void dc_receiver_free(dc_receiver* receiver);

/* Sets an option by key (before join). Keys: the YAML keys of docs/config.md that a receiver
 * uses (transport, secret_file, retain_versions, timeouts.connect, timeouts.heartbeat,
 * timeouts.peer, timeouts.join, timeouts.producer_loss, timeouts.refit, log_level), plus the
 * process-level ones: "producer" (the rendezvous URL), "rank" (1..N), "listen" (where children
 * connect, e.g. "tcp://127.0.0.1:0"), "cluster" (its label; or the YAML keys "clusters" = "auto" and
 * "probe_file", a `deltacast probe --out` report of the job: its rank's probe cluster), "gated" ("true": the apply
 * gate, see dc_receiver_apply; default "false"), "held_version" and "held_digest" (a restarted server whose buffers
 * still hold a committed version: the version and the digest dc_receiver_version gave for it, 16 hex digits; it rejoins
 * by replaying the deltas after it instead of a full snapshot; the producer refuses a digest it does not know for that
 * version with DC_ERR_VERIFY_FAILED, a version it never committed with DC_ERR_VERSION_MISMATCH, and start refuses
 * buffers whose bits differ with DC_ERR_VERIFY_FAILED, nothing written), "config" (a YAML file whose keys it loads,
 * then the environment over them; "members" there is ignored). Values are strings in the YAML spelling ("5s", "4MiB").
 * Layers as in the CLI: defaults (log_level "warn"), then the DELTACAST_* environment (DELTACAST_TIMEOUTS_PEER=5s, ...;
 * read at create), then these calls. */
DC_API int dc_receiver_set(dc_receiver* receiver, const char* key, const char* value);

/* Reaches the producer (retrying up to timeouts.join, or timeout_ms when > 0), says HELLO and
 * waits for WELCOME. Afterwards the manifest can be read with dc_receiver_tensor_count/tensor. */
DC_API int dc_receiver_join(dc_receiver* receiver, int64_t timeout_ms);
/* Tensors in the manifest (after join). */
DC_API int dc_receiver_tensor_count(const dc_receiver* receiver, size_t* count);
/* Tensor `index` of the manifest: name (valid while the receiver lives), dtype, ndim, and its
 * shape written into shape[0..min(ndim, shape_capacity)). Any output pointer may be NULL. */
DC_API int dc_receiver_tensor(const dc_receiver* receiver, size_t index, const char** name, int* dtype,
                              int* ndim, int64_t* shape, int shape_capacity);

/* Registers the caller's buffer for tensor `name` (after join, before start): refits are written
 * into it in place. dtype, ndim and shape must equal the manifest's; `nbytes` must be the
 * tensor's size. Its content at start does not matter (the bootstrap, version 1, overwrites all
 * of it) unless "held_version" was set: then it must hold that version's bits. Refused with nothing written: a wrong dtype, shape or size (DC_ERR_INVALID_ARGUMENT), an
 * unknown name (DC_ERR_NOT_FOUND), CUDA memory without CUDA support or a device (DC_ERR_UNSUPPORTED). */
DC_API int dc_receiver_attach(dc_receiver* receiver, const char* name, int dtype, int ndim, const int64_t* shape,
                              void* data, size_t nbytes, int device, int device_id);
/* A placed receiver (docs/placement.md): its buffers hold only slices of the checkpoint's tensors,
 * the way an inference engine shards and fuses them (tensor-parallel rows or columns, a padded
 * vocabulary range, fused qkv / gate_up, stacked experts). `placement` is the text of a placement
 * file (YAML or JSON: {buffer: [[tensor, dim, start, stop], ...]} or {buffer: {parts: [...],
 * shape: [...], stack: true}}; docs/placement.md, "Placement files"). After join, before a tensor
 * is attached whole; called again before start, it replaces the placement and forgets the
 * buffers attached for the previous one (a host retrying after a refused buffer). It is checked against the manifest
 * before anything is written: DC_ERR_CONFIG for text that does not parse ("placement:LINE:COL: ..."),
 * DC_ERR_INVALID_ARGUMENT naming the buffer and the part (an unknown tensor, a slice out of range, parts whose shapes
 * do not fit side by side, a dtype mismatch, overlapping parts, a wrong `bytes`). Then dc_receiver_attach takes each
 * placement buffer by its name, its dtype, shape (padding included) and size checked against the
 * placement; every buffer must be attached before start. The receiver applies only the changes in
 * its slices and verifies them against the producer's per-slice digests; it relays every frame to
 * its children. Padding is never written. Not supported for placed receivers: CUDA buffers and
 * dc_receiver_reattach (DC_ERR_UNSUPPORTED). */
DC_API int dc_receiver_place(dc_receiver* receiver, const char* placement);
/* Starts serving (returns at once): deltacast's threads connect to the tree, forward and apply
 * refits into the registered buffers. Every tensor (a placed receiver: every placement buffer)
 * must be attached. */
DC_API int dc_receiver_start(dc_receiver* receiver);

/* The committed version and its combined digest. Any thread, any time after create. */
DC_API int dc_receiver_version(const dc_receiver* receiver, uint64_t* version, uint64_t* digest);
/* Blocks until the committed version is >= `version` (DC_OK), timeout_ms passes (DC_ERR_TIMEOUT;
 * < 0 waits forever), or the receiver stopped first: its failure's status, or DC_ERR_STATE when
 * it ended cleanly (the producer's BYE, or a leave) at an older version. */
DC_API int dc_receiver_wait_version(dc_receiver* receiver, uint64_t version, int64_t timeout_ms);

/* ---- the apply gate ("gated" = "true") ----
 * A gated receiver forwards every frame at once and verifies each version against the bits its
 * buffers will hold (their bits plus the versions queued before it), then acks: the joint commit
 * never waits for the server. Committed versions queue, and nothing is written into the buffers
 * until the server calls dc_receiver_apply at a safe point of its own. The bootstrap (version 1)
 * and catch-up snapshots are written at once: there is nothing to serve yet. An aborted version
 * never reaches the queue. Ungated (the default), versions are written as they arrive: pause
 * reading the buffers while a refit flows (docs/embedding.md). */

/* The version the buffers hold (`applied_version`) and how many committed versions wait for
 * dc_receiver_apply (`count`: versions applied_version+1 .. applied_version+count; always 0 when
 * ungated). Any thread; either pointer may be NULL. */
DC_API int dc_receiver_pending(const dc_receiver* receiver, uint64_t* applied_version, size_t* count);
/* Writes every pending version into the buffers, oldest first, and returns the version they hold
 * in *applied_version (may be NULL). Call it when nothing reads the buffers (between generation
 * steps); refits keep flowing meanwhile. It cannot fail on data (each version was verified before
 * it committed). Ungated it writes nothing and returns DC_OK. DC_ERR_STATE before start. */
DC_API int dc_receiver_apply(dc_receiver* receiver, uint64_t* applied_version);
/* The server moved tensor `name` to new memory (vLLM re-binds parameters after loading): `data`
 * must already hold the bits the old buffer holds (checked by its digest), with the same size.
 * From then on refits land there; the old memory is never read again and may be freed once this
 * returns. After the bootstrap committed. Refused with nothing changed: other bits or size
 * (DC_ERR_INVALID_ARGUMENT), an unknown name (DC_ERR_NOT_FOUND), CUDA memory (DC_ERR_UNSUPPORTED),
 * before start or before version 1, or while an ungated version is being written (DC_ERR_STATE:
 * retry once it committed). */
DC_API int dc_receiver_reattach(dc_receiver* receiver, const char* name, void* data, size_t nbytes, int device,
                                int device_id);

typedef enum dc_event_kind {
  /* a version is committed (also after catching up): in the buffers, or (gated) pending until
   * dc_receiver_apply */
  DC_EVENT_COMMITTED = 1,
  DC_EVENT_ROLLED_BACK = 2, /* a version was aborted; the buffers hold the previous one */
  DC_EVENT_FAILED = 3,      /* the receiver stopped with an error (status and message given) */
  DC_EVENT_ENDED = 4        /* the producer said BYE; the receiver stopped cleanly */
} dc_event_kind;

/* Called on a deltacast thread for every event (the control thread: a slow callback delays the
 * next COMMIT or ABORT). It must return quickly and must not call dc_receiver_free on this
 * receiver; `user` must stay valid until dc_receiver_free returns (ENDED may come during it).
 * `message` is valid during the call only. */
typedef void (*dc_event_callback)(void* user, int kind, uint64_t version, int status, const char* message);
/* Installs (or with NULL removes) the callback (before start). Events are also queued for
 * dc_receiver_poll_event whether or not a callback is set (the queue keeps the last 1024). */
DC_API int dc_receiver_set_event_callback(dc_receiver* receiver, dc_event_callback callback, void* user);
/* Takes the oldest queued event: DC_OK with its fields, DC_PENDING when the queue is empty.
 * `message` (may be NULL) is valid until the next poll on this receiver. */
DC_API int dc_receiver_poll_event(dc_receiver* receiver, int* kind, uint64_t* version, int* status,
                                  const char** message);

/* ---- producer ---------------------------------------------------------------------------- */
typedef struct dc_producer dc_producer;

DC_API int dc_producer_create(dc_producer** out);
/* Says BYE to every receiver (when started), closes and frees. NULL is accepted. */
DC_API void dc_producer_free(dc_producer* producer);

/* Sets an option by key (before start): the YAML keys a producer uses (transport, topology,
 * chunk_bytes, retain_versions, secret_file, timeouts.*, log_level, commit, producer_cluster;
 * clusters = "auto" with probe_file: rank 0's probe cluster, the report must have receivers + 1
 * ranks, else DC_ERR_CONFIG at listen), plus "listen" (the
 * rendezvous URL, port 0 picks one), "receivers" (exactly how many members start waits for),
 * "threads" (encoder threads), and "config" as for the receiver; the environment likewise.
 * A producer group (docs/producer-group.md): "group_size" (M), "group_rank" (0: the coordinator,
 * which takes "receivers"; 1..M-1: a part rank, which needs "coordinator", rank 0's URL). Each rank
 * adds every tensor of the manifest; one outside its part may have data NULL and nbytes 0.
 * "group_parts" (optional, the same on every rank) is the trainer's own layout instead of the
 * balanced one: JSON, one array per rank of tensor names (whole tensors) or [name, first, end]
 * (elements [first, end) of a tensor); every element must be in exactly one rank's part. Each
 * rank's start and refit run at the same time as the others' (each blocks until the version is
 * decided); version 1 is every rank's part as RAW pieces, from its own memory. */
DC_API int dc_producer_set(dc_producer* producer, const char* key, const char* value);

/* Adds the next tensor of the manifest (before start), with its data for version 1. The data is
 * borrowed: it is read at dc_producer_start and at every refit (after dc_producer_set_data). */
DC_API int dc_producer_add_tensor(dc_producer* producer, const char* name, int dtype, int ndim,
                                  const int64_t* shape, const void* data, size_t nbytes, int device,
                                  int device_id);
/* Starts listening (after the first call the URL is known: dc_producer_url). Idempotent. */
DC_API int dc_producer_listen(dc_producer* producer);
/* The rendezvous URL with its real port (valid while the producer lives). Listens first if needed. */
DC_API int dc_producer_url(dc_producer* producer, const char** url);
/* Waits for every receiver (timeout_ms > 0 bounds it, else timeouts.join) and sends version 1:
 * the added tensors' data, as a full checkpoint. DC_ERR_ABORTED when version 1 did not commit. */
DC_API int dc_producer_start(dc_producer* producer, int64_t timeout_ms);
/* Points tensor `name` at new data for the next refit (same size). */
DC_API int dc_producer_set_data(dc_producer* producer, const char* name, const void* data, size_t nbytes);
/* Sends the tensors' current data as the next version (only changed elements travel) and commits
 * it when every live receiver verified it. dry_run != 0: delivered and verified, then aborted.
 * DC_OK when committed (or a dry run verified everywhere), DC_ERR_ABORTED otherwise; the report
 * says why. */
DC_API int dc_producer_refit(dc_producer* producer, int dry_run);
/* The last start/refit's report as JSON (the keys of `deltacast run`'s steps[]: version,
 * committed, changed_fraction, payload_bytes, refit_seconds, verified_receivers, receivers,
 * failed_members, epoch, repair_seconds, resent_chunks, ...). Valid until the next call. */
DC_API int dc_producer_report(const dc_producer* producer, const char** json);
/* The last committed version. */
DC_API int dc_producer_version(const dc_producer* producer, uint64_t* version);

#ifdef __cplusplus
}
#endif

#endif /* DELTACAST_DELTACAST_H */
