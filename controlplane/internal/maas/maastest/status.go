package maastest

// Status is MAAS's NODE_STATUS code (maasserver/enum.py).
type Status int

// MAAS machine status codes.
const (
	StatusNew                  Status = 0
	StatusCommissioning        Status = 1
	StatusFailedCommissioning  Status = 2
	StatusMissing              Status = 3
	StatusReady                Status = 4
	StatusReserved             Status = 5
	StatusDeployed             Status = 6
	StatusRetired              Status = 7
	StatusBroken               Status = 8
	StatusDeploying            Status = 9
	StatusAllocated            Status = 10
	StatusFailedDeployment     Status = 11
	StatusReleasing            Status = 12
	StatusFailedReleasing      Status = 13
	StatusDiskErasing          Status = 14
	StatusFailedDiskErasing    Status = 15
	StatusRescueMode           Status = 16
	StatusEnteringRescueMode   Status = 17
	StatusFailedEnteringRescue Status = 18
	StatusExitingRescueMode    Status = 19
	StatusFailedExitingRescue  Status = 20
	StatusTesting              Status = 21
	StatusFailedTesting        Status = 22
)

var statusNames = map[Status]string{
	StatusNew: "New", StatusCommissioning: "Commissioning", StatusFailedCommissioning: "Failed commissioning", StatusMissing: "Missing",
	StatusReady: "Ready", StatusReserved: "Reserved", StatusDeployed: "Deployed", StatusRetired: "Retired", StatusBroken: "Broken",
	StatusDeploying: "Deploying", StatusAllocated: "Allocated", StatusFailedDeployment: "Failed deployment", StatusReleasing: "Releasing",
	StatusFailedReleasing: "Failed releasing", StatusDiskErasing: "Disk erasing", StatusFailedDiskErasing: "Failed disk erasing",
	StatusRescueMode: "Rescue mode", StatusEnteringRescueMode: "Entering rescue mode", StatusFailedEnteringRescue: "Failed to enter rescue mode",
	StatusExitingRescueMode: "Exiting rescue mode", StatusFailedExitingRescue: "Failed to exit rescue mode", StatusTesting: "Testing",
	StatusFailedTesting: "Failed testing",
}

// String is MAAS's status_name.
func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return "Unknown"
}

// Actions and the statuses MAAS accepts them from (maasserver/node_action.py and the
// machine handler's state checks). Anything else is a NodeStateViolation: 409.
var actionableFrom = map[string][]Status{
	"commission":  {StatusNew, StatusReady, StatusFailedCommissioning, StatusFailedTesting, StatusFailedDiskErasing, StatusBroken},
	"deploy":      {StatusAllocated, StatusReady},
	"release":     {StatusAllocated, StatusReserved, StatusDeploying, StatusDeployed, StatusFailedDeployment, StatusFailedReleasing, StatusFailedDiskErasing, StatusBroken},
	"abort":       {StatusCommissioning, StatusTesting, StatusDeploying, StatusDiskErasing},
	"mark_broken": {StatusNew, StatusCommissioning, StatusFailedCommissioning, StatusReady, StatusAllocated, StatusDeploying, StatusDeployed, StatusFailedDeployment, StatusTesting, StatusFailedTesting, StatusFailedReleasing, StatusFailedDiskErasing},
	"mark_fixed":  {StatusBroken},
	"allocate":    {StatusReady},
	// MAAS's set_storage_layout checks `machine.status != NODE_STATUS.READY` (its old
	// docstring's "allocated" is not what the code does).
	"set_storage_layout": {StatusReady},
	"power_on":           {StatusNew, StatusReady, StatusAllocated, StatusDeployed, StatusBroken, StatusFailedCommissioning, StatusFailedDeployment, StatusFailedTesting, StatusFailedReleasing, StatusFailedDiskErasing},
	"power_off":          {StatusNew, StatusReady, StatusAllocated, StatusDeployed, StatusDeploying, StatusBroken, StatusCommissioning, StatusTesting, StatusFailedCommissioning, StatusFailedDeployment, StatusFailedTesting, StatusFailedReleasing, StatusFailedDiskErasing},
}

func allowed(action string, s Status) bool {
	for _, from := range actionableFrom[action] {
		if from == s {
			return true
		}
	}
	return false
}
