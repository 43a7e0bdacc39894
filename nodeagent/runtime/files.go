package runtime

import (
	"fmt"
	"io"
	"os"

	"github.com/gantry-gpu/gantry/nodeagent/internal/atomicfile"
)

// writeFileAtomic writes data to path so that readers (sshd, a shell, the next agent
// start) see the old file or the new one, never half of one.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	return atomicfile.Write(path, data, mode)
}

func readFileLimited(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, nil
}
