package vfio

// Unexported names the external tests (package vfio_test) reach. They live
// there because they drive the Binder through vfio/fakekernel, which
// imports this package.

var (
	AddressRE           = addressRE
	DevicePath          = devicePath
	DomainFromCmdline   = domainFromCmdline
	ParseClass          = parseClass
	ParseDriverLink     = parseDriverLink
	ParseDriverOverride = parseDriverOverride
	ParseGroupLink      = parseGroupLink
	ParseID             = parseID
	ParseNUMANode       = parseNUMANode
	ParseUevent         = parseUevent
	WarnText            = warnText
)

const DriversProbe = driversProbe
