//go:build !cgo

package main

import "errors"

func openDeviceMonitor(int) (deviceMonitor, error) {
	return nil, errors.New("nvml: built without cgo")
}
