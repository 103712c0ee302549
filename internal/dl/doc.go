// Package dl loads shared libraries at run time (dlopen/dlsym) so that
// distbuf builds and runs with no CUDA installed. A loader declares its
// symbols in a table; required ones must resolve, optional ones become
// capabilities. Libraries are opened lazily by their loaders, never in init,
// and stay open for the life of the process: the handles and function
// pointers are owned by this package's Library values.
package dl
