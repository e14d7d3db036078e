package inventory

// WithDenyAddresses keeps the GPUs at these PCI addresses out of the
// inventory (deny_devices): the agent neither offers nor binds them, and
// `gpuherd inventory` lists them as denied.
func WithDenyAddresses(addrs []string) Option {
	return func(inv *Inventory) {
		inv.denied = make(map[string]bool, len(addrs))
		for _, a := range addrs {
			inv.denied[a] = true
		}
	}
}

// Denied reports whether the GPU at addr is on the deny list.
func (inv *Inventory) Denied(addr string) bool { return inv.denied[addr] }
