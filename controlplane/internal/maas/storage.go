package maas

import (
	"errors"
	"net/url"

	"github.com/canonical/gomaasclient/client"
	"github.com/canonical/gomaasclient/entity"
)

// setStorageLayout is MAAS's machine operation set_storage_layout, which gomaasclient
// v0.15.0 does not wrap: POST /MAAS/api/2.0/machines/{system_id}/ with op=set_storage_layout
// and storage_layout=flat|lvm|bcache, sent through the client's own API object so it is
// signed with the same OAuth1 key as every other call. MAAS refuses it (409) unless the
// machine is Ready, and it replaces whatever layout the machine had: calling it again
// with the same layout is harmless, so a re-run after a crash may repeat it.
func setStorageLayout(c *client.Client, systemID, layout string) error {
	m, ok := c.Machine.(*client.Machine)
	if !ok {
		return errors.New("maas: the client's machine API is not gomaasclient's")
	}
	return m.APIClient.GetSubObject("machines").GetSubObject(systemID).
		Post("set_storage_layout", url.Values{"storage_layout": {layout}}, func([]byte) error { return nil })
}

// allocateWithLayout gives a Ready machine the profile's storage layout and allocates it
// to the onboarding. The layout goes first because MAAS only changes the layout of a
// Ready machine; a crash between the two leaves a Ready machine with the right layout,
// which the re-run sets again and allocates.
func allocateWithLayout(c *client.Client, o Onboarding) error {
	if o.Recipe.StorageLayout != "" {
		if err := setStorageLayout(c, *o.SystemID, o.Recipe.StorageLayout); err != nil {
			return err
		}
	}
	_, err := c.Machines.Allocate(&entity.MachineAllocateParams{SystemID: *o.SystemID, AgentName: "gantry",
		Comment: "gantry onboarding " + o.ID.String()})
	return err
}
