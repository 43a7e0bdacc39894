package maastest

import (
	"net/url"
	"strings"
	"testing"

	"github.com/canonical/gomaasclient/client"
	"github.com/canonical/gomaasclient/entity"
)

// setLayout sends set_storage_layout as the control plane does: through gomaasclient's
// signed API object (the client has no wrapper for it).
func setLayout(c *client.Client, id, layout string) error {
	return c.Machine.(*client.Machine).APIClient.GetSubObject("machines").GetSubObject(id).
		Post("set_storage_layout", url.Values{"storage_layout": {layout}}, func([]byte) error { return nil })
}

// set_storage_layout is accepted only while the machine is Ready (MAAS's own check is
// `machine.status != READY` -> 409 NodeStateViolation), is refused for a layout MAAS
// does not know, replaces the layout each time, and needs the OAuth signature.
func TestSetStorageLayout(t *testing.T) {
	s, c := start(t, Config{})
	id := s.AddMachine(MachineSpec{})
	if m, _ := s.Machine(id); m.StorageLayout != DefaultStorageLayout {
		t.Fatalf("new machine layout %q, want MAAS's default %q", m.StorageLayout, DefaultStorageLayout)
	}
	if err := setLayout(c, id, "lvm"); err != nil {
		t.Fatalf("set on a Ready machine: %v", err)
	}
	if err := setLayout(c, id, "lvm"); err != nil { // again: the same result
		t.Fatalf("set again: %v", err)
	}
	if m, _ := s.Machine(id); m.StorageLayout != "lvm" || m.LayoutSets != 2 {
		t.Fatalf("after two sets: %q, %d sets", m.StorageLayout, m.LayoutSets)
	}
	err := setLayout(c, id, "zfs-raidz9")
	if err == nil || !strings.Contains(err.Error(), "400") {
		t.Fatalf("unknown layout: %v, want 400", err)
	}
	if _, err := c.Machines.Allocate(&entity.MachineAllocateParams{SystemID: id}); err != nil {
		t.Fatal(err)
	}
	err = setLayout(c, id, "flat")
	if err == nil || !strings.Contains(err.Error(), "409") || !strings.Contains(err.Error(), "not Ready") {
		t.Fatalf("set on an Allocated machine: %v, want 409 not Ready", err)
	}
	if m, _ := s.Machine(id); m.StorageLayout != "lvm" {
		t.Fatalf("a refused set changed the layout to %q", m.StorageLayout)
	}
	bad := clientFor(t, s.URL(), "a:b:c")
	if err := setLayout(bad, id, "flat"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("unsigned set: %v, want 401", err)
	}
}
