package api_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/gpuherd/gpuherd/agent/api"
)

// fakeDomains is a service that also serves the libvirt hook's calls.
type fakeDomains struct {
	fakeService
	uses []api.UseRequest
	ends []string
}

func (f *fakeDomains) UseClaim(_ context.Context, id string, req api.UseRequest) (api.Claim, error) {
	f.uses = append(f.uses, req)
	return fakeClaim(id), nil
}

func (f *fakeDomains) EndUse(_ context.Context, id, uuid string, release bool) (api.UseEnd, error) {
	f.ends = append(f.ends, id+" "+uuid+" "+map[bool]string{true: "release", false: "keep"}[release])
	return api.UseEnd{Claim: fakeClaim(id), Released: release}, nil
}

func TestDomainRoutesOnTheLocalSocketOnly(t *testing.T) {
	svc := &fakeDomains{}
	log := slog.New(slog.DiscardHandler)
	put := `{"domain_uuid":"u-1","domain_name":"vm-1","pci_addresses":["0000:18:00.0"],"started":true}`

	local := httptest.NewServer(api.NewHandler(svc, log))
	defer local.Close()
	req, _ := http.NewRequest(http.MethodPut, local.URL+"/v1/claims/vm-1/domain", strings.NewReader(put))
	req.Header.Set("Content-Type", "application/json")
	resp, err := local.Client().Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("local PUT domain: %v %v", resp, err)
	}
	resp.Body.Close()
	want := api.UseRequest{DomainUUID: "u-1", DomainName: "vm-1", PCIAddresses: []string{"0000:18:00.0"}, Started: true}
	if len(svc.uses) != 1 || !reflect.DeepEqual(svc.uses[0], want) {
		t.Fatalf("UseClaim got %+v, want %+v", svc.uses, want)
	}
	req, _ = http.NewRequest(http.MethodDelete, local.URL+"/v1/claims/vm-1/domain?uuid=u-1&release=true", nil)
	resp, err = local.Client().Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("local DELETE domain: %v %v", resp, err)
	}
	var end api.UseEnd
	if err := json.NewDecoder(resp.Body).Decode(&end); err != nil || !end.Released {
		t.Fatalf("DELETE answer %+v, %v", end, err)
	}
	resp.Body.Close()
	for _, q := range []string{"release=true", "uuid=u-1&release=maybe"} {
		req, _ = http.NewRequest(http.MethodDelete, local.URL+"/v1/claims/vm-1/domain?"+q, nil)
		resp, err = local.Client().Do(req)
		if err != nil || resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("DELETE domain?%s: %v %v, want 400", q, resp, err)
		}
		resp.Body.Close()
	}
	if len(svc.ends) != 1 || svc.ends[0] != "vm-1 u-1 release" {
		t.Fatalf("EndUse calls %v", svc.ends)
	}

	// The peer API never marks a server's claims: another server must not.
	peer := httptest.NewServer(api.NewPeerHandler(svc, nil, log))
	defer peer.Close()
	req, _ = http.NewRequest(http.MethodPut, peer.URL+"/v1/claims/vm-1/domain", strings.NewReader(put))
	req.Header.Set("Content-Type", "application/json") // refused for its route, not its type
	resp, err = peer.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK || len(svc.uses) != 1 {
		t.Fatalf("peer PUT domain answered %d and reached the service (%d calls)", resp.StatusCode, len(svc.uses))
	}
}

// The client speaks the same routes.
func TestClientDomainCalls(t *testing.T) {
	svc := &fakeDomains{}
	c := unixServer(t, api.NewHandler(svc, slog.New(slog.DiscardHandler)))
	if _, err := c.UseClaim(context.Background(), "vm-1", api.UseRequest{DomainUUID: "u", CheckOnly: true}); err != nil {
		t.Fatal(err)
	}
	end, err := c.EndUse(context.Background(), "vm-1", "u&x", false)
	if err != nil || end.Released {
		t.Fatalf("EndUse = %+v, %v", end, err)
	}
	if len(svc.uses) != 1 || !svc.uses[0].CheckOnly || len(svc.ends) != 1 || svc.ends[0] != "vm-1 u&x keep" {
		t.Fatalf("calls: uses %+v, ends %v", svc.uses, svc.ends)
	}
}
