package agent

import (
	"context"

	"github.com/gpuherd/gpuherd/agent/names"
)

func (n *testNames) List(ctx context.Context, f names.Filter, mode names.ReadMode) (names.Listing, error) {
	if err := n.unavailable(names.OpList, names.Key{}); err != nil {
		return names.Listing{}, err
	}
	return n.reg.List(ctx, f, mode)
}
