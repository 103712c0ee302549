package rawmpi

import "errors"

// ErrNoMPI is returned by a build without the mpi tag.
var ErrNoMPI = errors.New("rawmpi: built without the mpi tag")
