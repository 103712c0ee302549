# Sourced by the GPU machine's scripts: sets the array mpirun to the
# launcher and the flags its Open MPI needs here (root, more ranks than
# cores); other MPIs get it bare.
mpirun=(mpirun)
if mpirun --version 2>&1 | grep -q "Open MPI"; then
  [ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
  mpirun+=(--oversubscribe)
fi
