package cuda

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

// NVML reads GPU utilisation and memory through libnvidia-ml.so.1 (the
// driver's management library), for metrics and benchmarks. NVML calls are
// thread-safe, so an NVML may be used from any goroutine; mu only guards
// the handle cache.
type NVML struct {
	mu                               sync.Mutex
	getHandle, getUtil, getMem, name uintptr
	shutdown                         uintptr
	handles                          map[int]uintptr
}

// GPUSample is one reading of one device.
type GPUSample struct {
	Name        string
	UtilGPU     int   // percent of the last sample period a kernel ran
	UtilMemory  int   // percent of the period device memory was read or written
	MemUsed     int64 // bytes
	MemTotal    int64 // bytes
	MemFree     int64 // bytes
	DeviceIndex int
}

var (
	nvmlOnce sync.Once
	nvmlInst *NVML
	nvmlErr  error
)

// OpenNVML loads and initialises NVML once per process. libDir as for
// Options.LibDir.
func OpenNVML(libDir string) (*NVML, error) {
	nvmlOnce.Do(func() { nvmlInst, nvmlErr = openNVML(libDir) })
	return nvmlInst, nvmlErr
}

func openNVML(libDir string) (*NVML, error) {
	h, _, err := openFirst("NVML (libnvidia-ml.so.1)", searchDirs(libDir, testLibDirs), nvmlNames)
	if err != nil {
		return nil, err
	}
	var miss []string
	n := &NVML{handles: map[int]uintptr{}}
	initFn := sym(h, "nvmlInit_v2", &miss)
	n.getHandle = sym(h, "nvmlDeviceGetHandleByIndex_v2", &miss)
	n.getUtil = sym(h, "nvmlDeviceGetUtilizationRates", &miss)
	n.getMem = sym(h, "nvmlDeviceGetMemoryInfo", &miss)
	n.name = sym(h, "nvmlDeviceGetName", &miss)
	n.shutdown = sym(h, "nvmlShutdown", &miss)
	if len(miss) > 0 {
		return nil, fmt.Errorf("cuda: NVML lacks %v", miss)
	}
	if r := sc(initFn); r != 0 {
		return nil, fmt.Errorf("cuda: nvmlInit_v2: error %d", r)
	}
	fixSignalStacks()
	return n, nil
}

// Sample reads device i's utilisation and memory.
func (n *NVML) Sample(i int) (GPUSample, error) {
	if n == nil {
		return GPUSample{}, errors.New("cuda: NVML not open")
	}
	n.mu.Lock()
	h, ok := n.handles[i]
	if !ok {
		if r := sc(n.getHandle, uintptr(i), uintptr(unsafe.Pointer(&h))); r != 0 {
			n.mu.Unlock()
			return GPUSample{}, fmt.Errorf("cuda: nvmlDeviceGetHandleByIndex(%d): error %d", i, r)
		}
		n.handles[i] = h
	}
	n.mu.Unlock()
	s := GPUSample{DeviceIndex: i}
	var util struct{ gpu, mem uint32 } // nvmlUtilization_t
	if r := sc(n.getUtil, h, uintptr(unsafe.Pointer(&util))); r != 0 {
		return s, fmt.Errorf("cuda: nvmlDeviceGetUtilizationRates: error %d", r)
	}
	var mem struct{ total, free, used uint64 } // nvmlMemory_t
	if r := sc(n.getMem, h, uintptr(unsafe.Pointer(&mem))); r != 0 {
		return s, fmt.Errorf("cuda: nvmlDeviceGetMemoryInfo: error %d", r)
	}
	name := make([]byte, 96)
	if r := sc(n.name, h, uintptr(unsafe.Pointer(&name[0])), uintptr(len(name))); r == 0 {
		for j, c := range name {
			if c == 0 {
				name = name[:j]
				break
			}
		}
		s.Name = string(name)
	}
	s.UtilGPU, s.UtilMemory = int(util.gpu), int(util.mem)
	s.MemTotal, s.MemFree, s.MemUsed = int64(mem.total), int64(mem.free), int64(mem.used)
	return s, nil
}
