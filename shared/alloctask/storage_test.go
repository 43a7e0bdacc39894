package alloctask

import "testing"

func TestStoragePayloadValidate(t *testing.T) {
	good := StoragePayload{
		AllocationID: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
		User:         "g0190a1b2c3d4",
		AttachmentID: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a60",
		BucketID:     "datasets",
		Mode:         StorageModeRO,
	}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid payload refused: %v", err)
	}
	if got := good.EffectiveMountPath(); got != "buckets/datasets" {
		t.Fatalf("default mount path = %q", got)
	}
	cases := map[string]func(p *StoragePayload){
		"bad allocation":    func(p *StoragePayload) { p.AllocationID = "x" },
		"bad attachment":    func(p *StoragePayload) { p.AttachmentID = "0190A1B2-C3D4-7E5F-8A9B-0C1D2E3F4A60" },
		"bad user":          func(p *StoragePayload) { p.User = "root;" },
		"bad bucket":        func(p *StoragePayload) { p.BucketID = "-x" },
		"bad mode":          func(p *StoragePayload) { p.Mode = "wo" },
		"dotdot bucket":     func(p *StoragePayload) { p.BucketID = "a/../../etc" },
		"absolute mount":    func(p *StoragePayload) { p.MountPath = "/etc" },
		"escaping mount":    func(p *StoragePayload) { p.MountPath = "data/../../x" },
		"dot mount":         func(p *StoragePayload) { p.MountPath = "./data" },
		"backslash mount":   func(p *StoragePayload) { p.MountPath = `data\..\..` },
		"trailing slash":    func(p *StoragePayload) { p.MountPath = "data/" },
		"control character": func(p *StoragePayload) { p.MountPath = "da\nta" },
		"too long":          func(p *StoragePayload) { p.MountPath = string(make([]byte, MaxMountPathBytes+1)) },
	}
	for name, mutate := range cases {
		p := good
		mutate(&p)
		if err := p.Validate(); err == nil {
			t.Errorf("%s: accepted %+v", name, p)
		}
	}
	p := good
	p.Mode, p.MountPath = StorageModeRW, "work/data"
	if err := p.Validate(); err != nil || p.EffectiveMountPath() != "work/data" {
		t.Fatalf("given mount path: %v %q", err, p.EffectiveMountPath())
	}
}
