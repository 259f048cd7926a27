package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"strings"
	"sync"
)

// Device is a CUDA device: its ordinal and the CUdevice handle for it.
type Device struct {
	ordinal int
	h       C.CUdevice
}

// DeviceCount returns the number of CUDA devices the process can see.
func DeviceCount() (int, error) {
	if err := loaded(); err != nil {
		return 0, err
	}
	var n C.int
	if err := check("cuDeviceGetCount", C.ucpx_device_count(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// GetDevice returns device number ordinal (0-based, as CUDA_VISIBLE_DEVICES renumbers them).
func GetDevice(ordinal int) (Device, error) {
	if err := loaded(); err != nil {
		return Device{}, err
	}
	if ordinal < 0 {
		return Device{}, invalid("cuDeviceGet", "negative device ordinal %d", ordinal)
	}
	var d C.CUdevice
	if err := check("cuDeviceGet", C.ucpx_device_get(&d, C.int(ordinal))); err != nil {
		return Device{}, err
	}
	return Device{ordinal: ordinal, h: d}, nil
}

// Ordinal is the device number GetDevice was called with.
func (d Device) Ordinal() int { return d.ordinal }

// Handle is the raw CUdevice.
func (d Device) Handle() int { return int(d.h) }

// Name returns the device's marketing name, e.g. "NVIDIA H200".
func (d Device) Name() (string, error) {
	var buf [256]C.char
	if err := check("cuDeviceGetName", C.ucpx_device_name(&buf[0], C.int(len(buf)), d.h)); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// PCIBusID returns the device's PCI address, e.g. "0000:19:00.0".
func (d Device) PCIBusID() (string, error) {
	var buf [64]C.char
	if err := check("cuDeviceGetPCIBusId", C.ucpx_device_pci_bus_id(&buf[0], C.int(len(buf)), d.h)); err != nil {
		return "", err
	}
	return strings.ToLower(C.GoString(&buf[0])), nil
}

// UUID returns the device's 16-byte UUID (cuDeviceGetUuid_v2: in MIG mode the MIG
// instance's). Two processes see the same UUID for the same device whatever their
// CUDA_VISIBLE_DEVICES numbering, which is how a peer tells that it shares a GPU.
func (d Device) UUID() ([16]byte, error) {
	var u [16]byte
	err := check("cuDeviceGetUuid", C.ucpx_device_uuid((*C.uchar)(&u[0]), d.h))
	return u, err
}

// DeviceAttribute is a CUdevice_attribute.
type DeviceAttribute int32

// The device attributes ucpx consults (values of CUdevice_attribute).
const (
	AttrMaxThreadsPerBlock             DeviceAttribute = 1
	AttrWarpSize                       DeviceAttribute = 10
	AttrMultiprocessorCount            DeviceAttribute = 16
	AttrIntegrated                     DeviceAttribute = 18
	AttrCanMapHostMemory               DeviceAttribute = 19
	AttrPCIBusID                       DeviceAttribute = 33
	AttrPCIDeviceID                    DeviceAttribute = 34
	AttrAsyncEngineCount               DeviceAttribute = 40
	AttrUnifiedAddressing              DeviceAttribute = 41
	AttrPCIDomainID                    DeviceAttribute = 50
	AttrComputeCapabilityMajor         DeviceAttribute = 75
	AttrComputeCapabilityMinor         DeviceAttribute = 76
	AttrManagedMemory                  DeviceAttribute = 83
	AttrHostNativeAtomicSupported      DeviceAttribute = 86
	AttrPageableMemoryAccess           DeviceAttribute = 88
	AttrConcurrentManagedAccess        DeviceAttribute = 89
	AttrCanUseHostPointerForRegistered DeviceAttribute = 91
	AttrCooperativeLaunch              DeviceAttribute = 95
	AttrCanFlushRemoteWrites           DeviceAttribute = 98
	AttrMemoryPoolsSupported           DeviceAttribute = 115
	AttrGPUDirectRDMASupported         DeviceAttribute = 116
	AttrCanUse64BitStreamMemOps        DeviceAttribute = 122
	AttrCanUseStreamWaitValueNOR       DeviceAttribute = 123
)

// Attribute returns one device attribute.
func (d Device) Attribute(a DeviceAttribute) (int, error) {
	var v C.int
	if err := check("cuDeviceGetAttribute", C.ucpx_device_attribute(&v, C.CUdevice_attribute(a), d.h)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// ComputeCapability returns the device's SM version, e.g. 9, 0 for an H200.
func (d Device) ComputeCapability() (major, minor int, err error) {
	if major, err = d.Attribute(AttrComputeCapabilityMajor); err != nil {
		return 0, 0, err
	}
	minor, err = d.Attribute(AttrComputeCapabilityMinor)
	return major, minor, err
}

// TotalMem returns the device memory size in bytes.
func (d Device) TotalMem() (uint64, error) {
	var n C.size_t
	if err := check("cuDeviceTotalMem", C.ucpx_device_total_mem(&n, d.h)); err != nil {
		return 0, err
	}
	return uint64(n), nil
}

// CanAccessPeer reports whether contexts on d can map memory of peer
// (Context.EnablePeerAccess).
func (d Device) CanAccessPeer(peer Device) (bool, error) {
	var v C.int
	if err := check("cuDeviceCanAccessPeer", C.ucpx_device_can_access_peer(&v, d.h, peer.h)); err != nil {
		return false, err
	}
	return v != 0, nil
}

// Caps are the capabilities ucpx decides its mechanisms on, probed once per
// device and cached.
type Caps struct {
	ComputeMajor, ComputeMinor int
	Multiprocessors            int
	// StreamMemOps64: 64-bit cuStreamWaitValue64/WriteValue64 and batch ops
	// (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS).
	StreamMemOps64 bool
	// WaitValueNOR: CU_STREAM_WAIT_VALUE_NOR is supported.
	WaitValueNOR bool
	// FlushRemoteWrites: CU_STREAM_WAIT_VALUE_FLUSH and the flush memop are supported.
	FlushRemoteWrites bool
	// MapHostMemory: cuMemHostAlloc(DEVICEMAP) memory is visible to the GPU.
	MapHostMemory bool
	// UnifiedAddressing: host and device share one virtual address space (UVA),
	// which cuMemcpyAsync with raw addresses relies on.
	UnifiedAddressing       bool
	ManagedMemory           bool
	ConcurrentManagedAccess bool
	PageableMemoryAccess    bool
	HostNativeAtomics       bool
}

type capsEntry struct {
	once sync.Once
	caps Caps
	err  error
}

var capsCache sync.Map // CUdevice -> *capsEntry

// Caps probes the device's capabilities once and returns the cached answer after.
func (d Device) Caps() (Caps, error) {
	v, _ := capsCache.LoadOrStore(d.h, new(capsEntry))
	e := v.(*capsEntry)
	e.once.Do(func() { e.caps, e.err = d.probeCaps() })
	return e.caps, e.err
}

func (d Device) probeCaps() (Caps, error) {
	var c Caps
	ints := []struct {
		a DeviceAttribute
		p *int
	}{
		{AttrComputeCapabilityMajor, &c.ComputeMajor},
		{AttrComputeCapabilityMinor, &c.ComputeMinor},
		{AttrMultiprocessorCount, &c.Multiprocessors},
	}
	for _, x := range ints {
		v, err := d.Attribute(x.a)
		if err != nil {
			return Caps{}, err
		}
		*x.p = v
	}
	bools := []struct {
		a DeviceAttribute
		p *bool
	}{
		{AttrCanUse64BitStreamMemOps, &c.StreamMemOps64},
		{AttrCanUseStreamWaitValueNOR, &c.WaitValueNOR},
		{AttrCanFlushRemoteWrites, &c.FlushRemoteWrites},
		{AttrCanMapHostMemory, &c.MapHostMemory},
		{AttrUnifiedAddressing, &c.UnifiedAddressing},
		{AttrManagedMemory, &c.ManagedMemory},
		{AttrConcurrentManagedAccess, &c.ConcurrentManagedAccess},
		{AttrPageableMemoryAccess, &c.PageableMemoryAccess},
		{AttrHostNativeAtomicSupported, &c.HostNativeAtomics},
	}
	for _, x := range bools {
		v, err := d.Attribute(x.a)
		if err != nil {
			return Caps{}, err
		}
		*x.p = v != 0
	}
	return c, nil
}
