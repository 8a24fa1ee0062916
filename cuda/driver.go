package cuda

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// driverFns are the CUDA driver API entry points we use. All but cuInit,
// cuDeviceGetCount and the error-name helpers must be called from the one
// OS thread that owns the context (see worker in backend.go).
type driverFns struct {
	cuInit, cuDeviceGetCount, cuDeviceGet, cuDeviceGetAttribute, cuDeviceGetName uintptr
	cuDeviceTotalMem, cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRelease        uintptr
	cuCtxSetCurrent                                                              uintptr
	cuMemAlloc, cuMemFree, cuMemGetInfo                                          uintptr
	cuMemcpyHtoDAsync, cuMemcpyDtoHAsync                                         uintptr
	cuModuleLoadData, cuModuleUnload, cuModuleGetFunction, cuLaunchKernel        uintptr
	cuStreamCreate, cuStreamDestroy, cuStreamSynchronize                         uintptr
	cuGetErrorName, cuGetErrorString                                             uintptr
	cuMemHostRegister, cuMemHostUnregister                                       uintptr
	// Page-locked staging and per-slot events of LaunchDraw/WaitDraw
	// (async.go).
	cuMemAllocHost, cuMemFreeHost                                    uintptr
	cuEventCreate, cuEventRecord, cuEventSynchronize, cuEventDestroy uintptr
	// Optional (graphs are off when any is missing).
	cuStreamBeginCapture, cuStreamEndCapture, cuGraphInstantiate, cuGraphLaunch uintptr
	cuGraphDestroy, cuGraphExecDestroy                                          uintptr
	// Optional: cuLaunchKernelEx (CUDA 12+), for programmatic dependent
	// launches (Options.PDL); 0 when absent.
	cuLaunchKernelEx uintptr
}

func (f *driverFns) load(h uintptr) error {
	var miss []string
	f.cuInit = sym(h, "cuInit", &miss)
	f.cuDeviceGetCount = sym(h, "cuDeviceGetCount", &miss)
	f.cuDeviceGet = sym(h, "cuDeviceGet", &miss)
	f.cuDeviceGetAttribute = sym(h, "cuDeviceGetAttribute", &miss)
	f.cuDeviceGetName = sym(h, "cuDeviceGetName", &miss)
	f.cuDeviceTotalMem = sym(h, "cuDeviceTotalMem_v2", &miss)
	f.cuDevicePrimaryCtxRetain = sym(h, "cuDevicePrimaryCtxRetain", &miss)
	f.cuDevicePrimaryCtxRelease = sym(h, "cuDevicePrimaryCtxRelease_v2", &miss)
	f.cuCtxSetCurrent = sym(h, "cuCtxSetCurrent", &miss)
	f.cuMemAlloc = sym(h, "cuMemAlloc_v2", &miss)
	f.cuMemFree = sym(h, "cuMemFree_v2", &miss)
	f.cuMemGetInfo = sym(h, "cuMemGetInfo_v2", &miss)
	f.cuMemcpyHtoDAsync = sym(h, "cuMemcpyHtoDAsync_v2", &miss)
	f.cuMemcpyDtoHAsync = sym(h, "cuMemcpyDtoHAsync_v2", &miss)
	f.cuModuleLoadData = sym(h, "cuModuleLoadData", &miss)
	f.cuModuleUnload = sym(h, "cuModuleUnload", &miss)
	f.cuModuleGetFunction = sym(h, "cuModuleGetFunction", &miss)
	f.cuLaunchKernel = sym(h, "cuLaunchKernel", &miss)
	f.cuStreamCreate = sym(h, "cuStreamCreate", &miss)
	f.cuStreamDestroy = sym(h, "cuStreamDestroy_v2", &miss)
	f.cuStreamSynchronize = sym(h, "cuStreamSynchronize", &miss)
	f.cuGetErrorName = sym(h, "cuGetErrorName", &miss)
	f.cuGetErrorString = sym(h, "cuGetErrorString", &miss)
	f.cuMemHostRegister = sym(h, "cuMemHostRegister_v2", &miss)
	f.cuMemHostUnregister = sym(h, "cuMemHostUnregister", &miss)
	f.cuMemAllocHost = sym(h, "cuMemAllocHost_v2", &miss)
	f.cuMemFreeHost = sym(h, "cuMemFreeHost", &miss)
	f.cuEventCreate = sym(h, "cuEventCreate", &miss)
	f.cuEventRecord = sym(h, "cuEventRecord", &miss)
	f.cuEventSynchronize = sym(h, "cuEventSynchronize", &miss)
	f.cuEventDestroy = sym(h, "cuEventDestroy_v2", &miss)
	if len(miss) > 0 {
		return fmt.Errorf("missing driver symbols: %s", strings.Join(miss, ", "))
	}
	var opt []string
	f.cuStreamBeginCapture = sym(h, "cuStreamBeginCapture_v2", &opt)
	f.cuStreamEndCapture = sym(h, "cuStreamEndCapture", &opt)
	f.cuGraphInstantiate = sym(h, "cuGraphInstantiateWithFlags", &opt)
	f.cuGraphLaunch = sym(h, "cuGraphLaunch", &opt)
	f.cuGraphDestroy = sym(h, "cuGraphDestroy", &opt)
	f.cuGraphExecDestroy = sym(h, "cuGraphExecDestroy", &opt)
	if len(opt) > 0 {
		f.cuGraphLaunch = 0
	}
	var ex []string
	f.cuLaunchKernelEx = sym(h, "cuLaunchKernelEx", &ex)
	return nil
}

// Device attribute ids (cuda.h CUdevice_attribute).
const (
	attrMultiprocessorCount   = 16
	attrComputeCapabilityMajr = 75
	attrComputeCapabilityMinr = 76
)

// cuErr turns a CUresult into an error naming the call.
func (f *driverFns) cuErr(what string, r uintptr) error {
	if r == 0 {
		return nil
	}
	name, desc := "", ""
	var p uintptr
	if f.cuGetErrorName != 0 {
		if rr, _, _ := purego.SyscallN(f.cuGetErrorName, r, uintptr(unsafe.Pointer(&p))); rr == 0 {
			name = goString(p)
		}
	}
	if f.cuGetErrorString != 0 {
		p = 0
		if rr, _, _ := purego.SyscallN(f.cuGetErrorString, r, uintptr(unsafe.Pointer(&p))); rr == 0 {
			desc = goString(p)
		}
	}
	return fmt.Errorf("cuda: %s: error %d %s (%s)", what, int(r), name, desc)
}

// call invokes a driver function and converts its CUresult.
//
// go:uintptrescapes, as on purego.SyscallN: callers pass out-parameters
// as uintptr(unsafe.Pointer(&local)), and the directive only covers
// conversions written in a call to the function that carries it. Without
// it such a local may stay on the stack, the stack may be copied while
// the call runs, and the driver writes the old copy: cuMemAlloc's
// pointer is lost (TestWrappersKeepOutParamsOffTheStack).
//
//go:uintptrescapes
func (f *driverFns) call(what string, fn uintptr, args ...uintptr) error {
	r, _, _ := purego.SyscallN(fn, args...)
	return f.cuErr(what, uint32r(r))
}

// uint32r keeps the low 32 bits of a C enum return value (the upper half of
// RAX is unspecified for 32-bit returns).
func uint32r(r uintptr) uintptr { return uintptr(uint32(r)) }

// deviceCount initialises the driver (any thread) and counts devices.
func (f *driverFns) deviceCount() (int, error) {
	if err := f.call("cuInit", f.cuInit, 0); err != nil {
		return 0, err
	}
	var n int32
	if err := f.call("cuDeviceGetCount", f.cuDeviceGetCount, uintptr(unsafe.Pointer(&n))); err != nil {
		return 0, err
	}
	return int(n), nil
}

// goString copies a NUL-terminated C string. The memory belongs to the
// library (static strings, or buffers we allocated ourselves).
func goString(p uintptr) string {
	if p == 0 {
		return ""
	}
	// Reinterpret the address held in p as a pointer (C memory, never moved
	// or collected by Go).
	base := *(*unsafe.Pointer)(unsafe.Pointer(&p))
	var b []byte
	for i := 0; i < 1<<16; i++ {
		c := *(*byte)(unsafe.Add(base, i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// cString returns a NUL-terminated copy of s; keep the slice alive across
// the call that reads it.
func cString(s string) []byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return b
}
