/*
 * xdna_vl_runtime.h — the C ABI of an xdna-vl NPU runtime.
 *
 * A runtime is a shared library exporting exactly the functions below. `npu-sys` opens it with
 * libloading at run time and resolves every symbol when it opens it. Two runtimes exist:
 *   - libxdna_vl_xrt.so  (npu-sys/xrt-shim): a C++ shim over XRT's C++ API, for a real Ryzen AI NPU;
 *   - libnpu_emu.so      (npu-sys/emu):      the software NPU, computing the same designs on the CPU.
 *
 * Why our own ABI: XRT's C API cannot load a design on an NPU (load_axlf is refused by amdxdna);
 * register_xclbin and hw_context exist only in XRT's C++ API (see shared docs/DEVICE.md).
 *
 * Conventions
 *   - Plain C types only. Every function returning `int` returns XDNA_VL_OK (0) on success and a
 *     nonzero XDNA_VL_ERR_* code on failure; the failure's text is then available from
 *     xdna_vl_last_error() on the same thread until the next call on that thread.
 *   - Handles are opaque. A child handle must be freed before its parent
 *     (runs and buffers before their design, designs before their device).
 *   - Buffer memory returned by xdna_vl_buffer_map stays valid until xdna_vl_buffer_free. The host
 *     must not touch the A, B or C buffers of a run between xdna_vl_run_start and a wait that
 *     returned a final state (or xdna_vl_run_free).
 *   - Calls may come from any thread and at the same time (a device or design handle may be used
 *     by several threads at once), except that calls on one buffer, or on one run, never overlap.
 *   - All multi-byte values in buffers are little-endian.
 */
#ifndef XDNA_VL_RUNTIME_H
#define XDNA_VL_RUNTIME_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any change to a signature, a struct, a constant or a buffer layout below. */
#define XDNA_VL_ABI_VERSION 2u

/* The installed name of the real runtime (searched in the usual library directories). */
#define XDNA_VL_XRT_RUNTIME_NAME "libxdna_vl_xrt.so"

/* Return codes. */
#define XDNA_VL_OK 0
#define XDNA_VL_ERR_INVALID 1  /* bad argument, unknown handle, wrong group, wrong size */
#define XDNA_VL_ERR_NOT_FOUND 2 /* a file, device or kernel that does not exist */
#define XDNA_VL_ERR_IO 3        /* a file that exists but cannot be read */
#define XDNA_VL_ERR_DEVICE 4    /* the driver / XRT refused or failed */

/* xdna_vl_runtime_flags() bits. */
#define XDNA_VL_RUNTIME_SOFTWARE 1u /* a CPU implementation: no device node is needed */

/* Final states of a run: the values of XRT's ert_cmd_state. */
#define XDNA_VL_STATE_NEW 1u
#define XDNA_VL_STATE_QUEUED 2u
#define XDNA_VL_STATE_RUNNING 3u
#define XDNA_VL_STATE_COMPLETED 4u
#define XDNA_VL_STATE_ERROR 5u
#define XDNA_VL_STATE_ABORT 6u
#define XDNA_VL_STATE_SUBMITTED 7u
#define XDNA_VL_STATE_TIMEOUT 8u
#define XDNA_VL_STATE_NORESPONSE 9u

/* Design kinds. */
#define XDNA_VL_KIND_I8 1u
#define XDNA_VL_KIND_Q4 2u

/*
 * Argument groups: the kernel argument index each data buffer is bound to (XRT kernel.group_id(g)).
 * Group 1 is the instruction buffer, owned by the runtime.
 *
 * Buffer layouts for a design of geometry (kind, M = m_tile, K = k, N = n):
 *   A (group 3): int8 [M][K] row-major, M*K bytes. Rows past the live ones must be zero.
 *   B (group 4), kind I8: int8 [N][K] row-major (a linear weight [out][in], i.e. B column-major),
 *                N*K bytes.
 *   B (group 4), kind Q4: the pack's q4 layout, two parts back to back:
 *                codes  [N][K/2] bytes: row n holds K 4-bit codes -8..7, element 2i in the low
 *                       nibble and element 2i+1 in the high nibble of byte i, each nibble the
 *                       code + 8 (offset binary; version 1 stored two's complement);
 *                scales [N][K/32] bf16 (little-endian u16 bit patterns), one per group of 32
 *                       consecutive elements of a row; the scales start at byte offset N*K/2.
 *                N*K/2 + N*(K/32)*2 bytes in all. K must be a multiple of 32.
 *   C (group 5), kind I8: int32 [M][N] row-major, M*N*4 bytes: C[m][n] = sum_k A[m][k] * B[n][k],
 *                exact.
 *   C (group 5), kind Q4: f32 [M][N] row-major, M*N*4 bytes: for each group g = 0, 1, ... in
 *                ascending order, acc += (f32)(exact int dot of A[m] and B[n] over group g)
 *                * (f32)scale[n][g], acc starting at 0.0f; C[m][n] = acc. No activation scale:
 *                the host multiplies by the row's activation scale afterwards.
 * A buffer whose size is not its group's size for the design's geometry is refused.
 */
#define XDNA_VL_GROUP_A 3u
#define XDNA_VL_GROUP_B 4u
#define XDNA_VL_GROUP_C 5u

/* Sync directions (XRT's xclBOSyncDirection). */
#define XDNA_VL_SYNC_TO_DEVICE 0u
#define XDNA_VL_SYNC_FROM_DEVICE 1u

typedef struct xdna_vl_device xdna_vl_device;
typedef struct xdna_vl_design xdna_vl_design;
typedef struct xdna_vl_buffer xdna_vl_buffer;
typedef struct xdna_vl_run xdna_vl_run;

/* What the runtime says about an open device. Strings are NUL-terminated. */
typedef struct xdna_vl_device_info {
  char name[64];     /* e.g. "RyzenAI-npu4" or "npu-emu" */
  char firmware[64]; /* firmware version text, "" when unknown */
  uint32_t columns;  /* AIE columns available to a hardware context, 0 when unknown */
  uint32_t software; /* 1 for a software NPU, else 0 */
} xdna_vl_device_info;

/* A design to load into a hardware context. Paths are NUL-terminated, absolute or relative to the
 * process's working directory. The geometry is what the design was built for: the runtime sizes
 * and checks buffers by it, and the software NPU computes by it. */
typedef struct xdna_vl_design_desc {
  const char *xclbin_path; /* the design's xclbin */
  const char *insts_path;  /* its instruction stream: little-endian u32 words */
  const char *kernel_name; /* the kernel in the xclbin, "MLIR_AIE..." */
  uint32_t kind;           /* XDNA_VL_KIND_I8 or XDNA_VL_KIND_Q4 */
  uint32_t m_tile;         /* rows of A per launch */
  uint32_t k;              /* reduction length */
  uint32_t n;              /* columns of C (rows of B) */
} xdna_vl_design_desc;

/* XDNA_VL_ABI_VERSION of the library. Checked before any other symbol is used. */
uint32_t xdna_vl_abi_version(void);

/* XDNA_VL_RUNTIME_* bits. Callable before any device is opened. */
uint32_t xdna_vl_runtime_flags(void);

/* Text of the last failure on the calling thread ("" if none). Valid until the next call on this
 * thread; copy it. */
const char *xdna_vl_last_error(void);

/* Open device `index` (0 for the first NPU) and fill *info. */
int xdna_vl_device_open(uint32_t index, xdna_vl_device **out, xdna_vl_device_info *info);
void xdna_vl_device_close(xdna_vl_device *device);

/* Register the xclbin, create a hardware context, open the kernel, load the instruction stream. */
int xdna_vl_design_load(xdna_vl_device *device, const xdna_vl_design_desc *desc,
                        xdna_vl_design **out);
void xdna_vl_design_unload(xdna_vl_design *design);

/* Allocate a zeroed buffer in `group` of `design`; `size` must be the group's size (see above). */
int xdna_vl_buffer_alloc(xdna_vl_design *design, uint32_t group, uint64_t size,
                         xdna_vl_buffer **out);
/* Host view of the buffer: *data (aligned to at least 64 bytes) and *size. */
int xdna_vl_buffer_map(xdna_vl_buffer *buffer, void **data, uint64_t *size);
/* direction: XDNA_VL_SYNC_TO_DEVICE or XDNA_VL_SYNC_FROM_DEVICE. */
int xdna_vl_buffer_sync(xdna_vl_buffer *buffer, uint32_t direction);
void xdna_vl_buffer_free(xdna_vl_buffer *buffer);

/* Launch the design on (A, B, C): each buffer must belong to `design` and to its group. */
int xdna_vl_run_start(xdna_vl_design *design, xdna_vl_buffer *a, xdna_vl_buffer *b,
                      xdna_vl_buffer *c, xdna_vl_run **out);
/* Wait at most timeout_ms for the run; *state is its state then (XDNA_VL_STATE_TIMEOUT if it had
 * not finished). Returns XDNA_VL_OK whenever *state was set, whatever the state. */
int xdna_vl_run_wait(xdna_vl_run *run, uint32_t timeout_ms, uint32_t *state);
/* Free a run. A run that is still executing is waited for (or abandoned, if it hung) first. */
void xdna_vl_run_free(xdna_vl_run *run);

#ifdef __cplusplus
}
#endif

#endif /* XDNA_VL_RUNTIME_H */
