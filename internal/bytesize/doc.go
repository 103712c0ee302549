// Package bytesize reads and writes sizes in bytes the way distbuf's
// configuration strings and messages spell them: "64KiB", "1.5GB", "2G" in,
// "1.5 GiB" out. devalloc (DISTBUF_ALLOC_CONF), msg (DISTBUF_MSG_CHUNK) and
// the commands share it. It holds no state and owns nothing: every call
// returns a fresh value.
package bytesize
