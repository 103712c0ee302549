/*
 * How other loaders' C trampolines (internal/cublas, internal/nccl) set the
 * device before each call, the way package cudart's own trampolines do:
 * Runtime.SetDeviceFunc returns a pointer to the dbc_device_setter of the
 * loaded runtime, which lives as long as the process, and DBC_SET_DEVICE
 * calls it. It returns a cudaError_t.
 */
#ifndef DISTBUF_CUDART_SETDEV_H
#define DISTBUF_CUDART_SETDEV_H

typedef struct dbc_device_setter {
	int (*fn)(void *table, int dev);
	void *table;
} dbc_device_setter;

#define DBC_SET_DEVICE(setter, dev) \
	(((const dbc_device_setter *)(setter))->fn(((const dbc_device_setter *)(setter))->table, (dev)))

#endif
