// libxdna_vl_xrt.so: the xdna-vl runtime ABI (../include/xdna_vl_runtime.h) over XRT's C++ API.
//
// UNVERIFIED ON HARDWARE: written against XRT's documented C++ API and mlir-aie's host code, and
// never built or run on a Ryzen AI machine by this project. See README.md.
//
// Why C++: XRT's C API loads xclbins through load_axlf, which the amdxdna plugin refuses; the NPU
// needs xrt::device::register_xclbin and xrt::hw_context, which exist only in the C++ API.

#include "xdna_vl_runtime.h"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <xrt/xrt_bo.h>
#include <xrt/xrt_device.h>
#include <xrt/xrt_hw_context.h>
#include <xrt/xrt_kernel.h>
#if __has_include(<xrt/experimental/xrt_xclbin.h>)
#include <xrt/experimental/xrt_xclbin.h>
#else
#include <xrt/xrt_xclbin.h>
#endif

namespace {

thread_local std::string last_error;

int fail(int code, const std::string &message) {
  last_error = message;
  return code;
}

// Runs `body`, turning any exception into XDNA_VL_ERR_DEVICE and its text: no exception may
// cross the C ABI.
template <typename F> int guarded(const char *call, F body) {
  try {
    return body();
  } catch (const std::exception &e) {
    return fail(XDNA_VL_ERR_DEVICE, std::string(call) + ": " + e.what());
  } catch (...) {
    return fail(XDNA_VL_ERR_DEVICE, std::string(call) + ": unknown exception");
  }
}

constexpr uint32_t kQ4Group = 32;

struct Geometry {
  uint32_t kind, m, k, n;

  // Bytes of the buffer of `group` (the header's layouts); 0 for an unknown group.
  uint64_t buffer_len(uint32_t group) const {
    const uint64_t M = m, K = k, N = n;
    switch (group) {
    case XDNA_VL_GROUP_A:
      return M * K;
    case XDNA_VL_GROUP_B:
      return kind == XDNA_VL_KIND_I8 ? N * K : N * (K / 2) + N * (K / kQ4Group) * 2;
    case XDNA_VL_GROUP_C:
      return M * N * 4;
    default:
      return 0;
    }
  }

  std::string text() const {
    return std::string(kind == XDNA_VL_KIND_I8 ? "i8" : "q4") + " M" + std::to_string(m) + " K" +
           std::to_string(k) + " N" + std::to_string(n);
  }
};

void copy_text(char (&dst)[64], const std::string &src) {
  std::memset(dst, 0, sizeof dst);
  std::strncpy(dst, src.c_str(), sizeof dst - 1);
}

} // namespace

struct xdna_vl_device {
  xrt::device device;
};

struct xdna_vl_design {
  xdna_vl_device *device;
  std::string name; // the xclbin path, for messages
  Geometry geometry;
  xrt::xclbin xclbin;
  xrt::hw_context context;
  xrt::kernel kernel;
  xrt::bo instructions;
  uint32_t instruction_words;
};

struct xdna_vl_buffer {
  xdna_vl_design *design;
  uint32_t group;
  xrt::bo bo;
};

struct xdna_vl_run {
  xrt::run run;
};

extern "C" {

uint32_t xdna_vl_abi_version(void) { return XDNA_VL_ABI_VERSION; }

uint32_t xdna_vl_runtime_flags(void) { return 0; }

const char *xdna_vl_last_error(void) { return last_error.c_str(); }

int xdna_vl_device_open(uint32_t index, xdna_vl_device **out, xdna_vl_device_info *info) {
  return guarded("xdna_vl_device_open", [&] {
    if (!out || !info)
      return fail(XDNA_VL_ERR_INVALID, "xdna_vl_device_open: NULL out-pointer");
    auto handle = std::make_unique<xdna_vl_device>(xdna_vl_device{xrt::device(index)});
    std::memset(info, 0, sizeof *info);
    copy_text(info->name, handle->device.get_info<xrt::info::device::name>());
    copy_text(info->firmware, ""); // not queried: no stable XRT key for NPU firmware
    info->columns = 0;             // unknown: the driver time-shares columns between contexts
    info->software = 0;
    *out = handle.release();
    return XDNA_VL_OK;
  });
}

void xdna_vl_device_close(xdna_vl_device *device) { delete device; }

int xdna_vl_design_load(xdna_vl_device *device, const xdna_vl_design_desc *desc, xdna_vl_design **out) {
  return guarded("xdna_vl_design_load", [&] {
    if (!device || !desc || !out || !desc->xclbin_path || !desc->insts_path || !desc->kernel_name)
      return fail(XDNA_VL_ERR_INVALID, "xdna_vl_design_load: NULL argument");
    Geometry geometry{desc->kind, desc->m_tile, desc->k, desc->n};
    if ((geometry.kind != XDNA_VL_KIND_I8 && geometry.kind != XDNA_VL_KIND_Q4) || !geometry.m ||
        !geometry.k || !geometry.n || (geometry.kind == XDNA_VL_KIND_Q4 && geometry.k % kQ4Group))
      return fail(XDNA_VL_ERR_INVALID, "invalid design geometry");

    std::ifstream insts_file(desc->insts_path, std::ios::binary | std::ios::ate);
    if (!insts_file)
      return fail(XDNA_VL_ERR_NOT_FOUND, std::string("instruction file ") + desc->insts_path + " does not exist");
    const std::streamsize insts_bytes = insts_file.tellg();
    if (insts_bytes <= 0 || insts_bytes % 4)
      return fail(XDNA_VL_ERR_INVALID, std::string("instruction file ") + desc->insts_path +
                                           " is not a whole number of u32 words");
    std::vector<uint32_t> words(static_cast<size_t>(insts_bytes / 4));
    insts_file.seekg(0);
    insts_file.read(reinterpret_cast<char *>(words.data()), insts_bytes);
    if (!insts_file)
      return fail(XDNA_VL_ERR_IO, std::string("cannot read ") + desc->insts_path);
    if (!std::ifstream(desc->xclbin_path).good())
      return fail(XDNA_VL_ERR_NOT_FOUND, std::string("xclbin ") + desc->xclbin_path + " does not exist");

    xrt::xclbin xclbin(std::string(desc->xclbin_path));
    const std::string wanted = desc->kernel_name;
    std::string kernel_name;
    for (auto &kernel : xclbin.get_kernels()) {
      if (kernel.get_name().rfind(wanted, 0) == 0) { // mlir-aie names start with MLIR_AIE
        kernel_name = kernel.get_name();
        break;
      }
    }
    if (kernel_name.empty())
      return fail(XDNA_VL_ERR_NOT_FOUND, "kernel " + wanted + " is not in xclbin " + desc->xclbin_path);

    device->device.register_xclbin(xclbin);
    xrt::hw_context context(device->device, xclbin.get_uuid());
    xrt::kernel kernel(context, kernel_name);
    xrt::bo instructions(device->device, words.size() * sizeof(uint32_t), XCL_BO_FLAGS_CACHEABLE,
                         kernel.group_id(1));
    std::memcpy(instructions.map<void *>(), words.data(), words.size() * sizeof(uint32_t));
    instructions.sync(XCL_BO_SYNC_BO_TO_DEVICE);

    *out = new xdna_vl_design{device,  desc->xclbin_path, geometry, std::move(xclbin), std::move(context),
                              std::move(kernel), std::move(instructions), static_cast<uint32_t>(words.size())};
    return XDNA_VL_OK;
  });
}

void xdna_vl_design_unload(xdna_vl_design *design) { delete design; }

int xdna_vl_buffer_alloc(xdna_vl_design *design, uint32_t group, uint64_t size, xdna_vl_buffer **out) {
  return guarded("xdna_vl_buffer_alloc", [&] {
    if (!design || !out)
      return fail(XDNA_VL_ERR_INVALID, "xdna_vl_buffer_alloc: NULL argument");
    const uint64_t expected = design->geometry.buffer_len(group);
    if (!expected)
      return fail(XDNA_VL_ERR_INVALID, "group " + std::to_string(group) + " is not a data group (3, 4, 5)");
    if (size != expected)
      return fail(XDNA_VL_ERR_INVALID, "buffer of group " + std::to_string(group) + " of design " + design->name +
                                           " (" + design->geometry.text() + ") must be " +
                                           std::to_string(expected) + " bytes, not " + std::to_string(size));
    xrt::bo bo(design->device->device, size, XRT_BO_FLAGS_HOST_ONLY, design->kernel.group_id(static_cast<int>(group)));
    // Zero at creation: uninitialised device buffers gave nondeterministic results.
    std::memset(bo.map<void *>(), 0, size);
    bo.sync(XCL_BO_SYNC_BO_TO_DEVICE);
    *out = new xdna_vl_buffer{design, group, std::move(bo)};
    return XDNA_VL_OK;
  });
}

int xdna_vl_buffer_map(xdna_vl_buffer *buffer, void **data, uint64_t *size) {
  return guarded("xdna_vl_buffer_map", [&] {
    if (!buffer || !data || !size)
      return fail(XDNA_VL_ERR_INVALID, "xdna_vl_buffer_map: NULL argument");
    *data = buffer->bo.map<void *>();
    *size = buffer->bo.size();
    return XDNA_VL_OK;
  });
}

int xdna_vl_buffer_sync(xdna_vl_buffer *buffer, uint32_t direction) {
  return guarded("xdna_vl_buffer_sync", [&] {
    if (!buffer)
      return fail(XDNA_VL_ERR_INVALID, "xdna_vl_buffer_sync: NULL buffer");
    if (direction == XDNA_VL_SYNC_TO_DEVICE)
      buffer->bo.sync(XCL_BO_SYNC_BO_TO_DEVICE);
    else if (direction == XDNA_VL_SYNC_FROM_DEVICE)
      buffer->bo.sync(XCL_BO_SYNC_BO_FROM_DEVICE);
    else
      return fail(XDNA_VL_ERR_INVALID, "sync direction " + std::to_string(direction));
    return XDNA_VL_OK;
  });
}

void xdna_vl_buffer_free(xdna_vl_buffer *buffer) { delete buffer; }

int xdna_vl_run_start(xdna_vl_design *design, xdna_vl_buffer *a, xdna_vl_buffer *b, xdna_vl_buffer *c,
                      xdna_vl_run **out) {
  return guarded("xdna_vl_run_start", [&] {
    if (!design || !a || !b || !c || !out)
      return fail(XDNA_VL_ERR_INVALID, "xdna_vl_run_start: NULL argument");
    if (a->design != design || b->design != design || c->design != design)
      return fail(XDNA_VL_ERR_INVALID, "a buffer belongs to another design than " + design->name);
    if (a->group != XDNA_VL_GROUP_A || b->group != XDNA_VL_GROUP_B || c->group != XDNA_VL_GROUP_C)
      return fail(XDNA_VL_ERR_INVALID, "buffers passed in the wrong groups");
    const unsigned int opcode = 3; // mlir-aie: run the instruction stream
    xrt::run run = design->kernel(opcode, design->instructions, design->instruction_words, a->bo, b->bo, c->bo);
    *out = new xdna_vl_run{std::move(run)};
    return XDNA_VL_OK;
  });
}

int xdna_vl_run_wait(xdna_vl_run *run, uint32_t timeout_ms, uint32_t *state) {
  return guarded("xdna_vl_run_wait", [&] {
    if (!run || !state)
      return fail(XDNA_VL_ERR_INVALID, "xdna_vl_run_wait: NULL argument");
    const ert_cmd_state s = run->run.wait(std::chrono::milliseconds(timeout_ms));
    *state = static_cast<uint32_t>(s);
    return XDNA_VL_OK;
  });
}

void xdna_vl_run_free(xdna_vl_run *run) {
  if (!run)
    return;
  try {
    // A run still executing is given a moment, then aborted, so its buffers can be freed.
    const ert_cmd_state s = run->run.wait(std::chrono::milliseconds(1000));
    if (s != ERT_CMD_STATE_COMPLETED && s != ERT_CMD_STATE_ERROR && s != ERT_CMD_STATE_ABORT)
      run->run.abort();
  } catch (...) {
  }
  delete run;
}

} // extern "C"
