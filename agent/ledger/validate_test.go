package ledger

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestValidateID(t *testing.T) {
	tests := []struct {
		id      string
		wantErr bool
	}{
		{"vm-1", false},
		{"a", false},
		{"Node_7.group-b", false},
		{"6f1c2a9e-6a47-4d0b-9d8e-3f1a2b3c4d5e", false},
		{strings.Repeat("x", MaxIDLen), false},
		{"", true},
		{strings.Repeat("x", MaxIDLen+1), true},
		{"vm 1", true},
		{"vm/1", true},
		{"../etc", true},
		{"vm:1", true},
		{"vm\n1", true},
		{"vmé", true},
	}
	for _, tt := range tests {
		err := ValidateID(tt.id)
		if (err != nil) != tt.wantErr {
			t.Errorf("ValidateID(%q) = %v, want error %v", tt.id, err, tt.wantErr)
			continue
		}
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Field != "id" || !errors.Is(err, ErrInvalid) {
				t.Errorf("ValidateID(%q) = %#v, want *ValidationError on field id matching ErrInvalid", tt.id, err)
			}
		}
	}
}

func TestValidateRequest(t *testing.T) {
	manyLabels := map[string]string{}
	for i := range MaxLabels + 1 {
		manyLabels[fmt.Sprintf("k%d", i)] = "v"
	}
	maxLabels := map[string]string{}
	for i := range MaxLabels {
		maxLabels[fmt.Sprintf("k%d", i)] = "v"
	}
	tests := []struct {
		name      string
		req       Request
		max       int
		wantField string // "" means valid
	}{
		{name: "one item", req: req(Item{Model: h100, Count: 1})},
		{name: "several models", req: req(Item{Model: h100, Count: 4}, Item{Model: l40s, Count: 2})},
		{name: "exactly the default max", req: req(Item{Model: h100, Count: 8}, Item{Model: l40s, Count: 8})},
		{name: "max from the caller", req: req(Item{Model: h100, Count: 20}), max: 32},
		{name: "labels at the limits", req: Request{Items: []Item{{Model: h100, Count: 1}}, Labels: map[string]string{
			strings.Repeat("k", MaxLabelKeyLen): strings.Repeat("v", MaxLabelValueLen),
			"gpuherd.io/vm":                     "vm-1",
		}}},
		{name: "32 labels", req: Request{Items: []Item{{Model: h100, Count: 1}}, Labels: maxLabels}},

		{name: "no items", req: Request{}, wantField: "items"},
		{name: "empty model", req: req(Item{Model: "", Count: 1}), wantField: "items[0].model"},
		{name: "model with control char", req: req(Item{Model: "H100\x00", Count: 1}), wantField: "items[0].model"},
		{name: "model with spaces around", req: req(Item{Model: " H100", Count: 1}), wantField: "items[0].model"},
		{name: "model too long", req: req(Item{Model: strings.Repeat("m", MaxModelLen+1), Count: 1}), wantField: "items[0].model"},
		{name: "zero count", req: req(Item{Model: h100, Count: 0}), wantField: "items[0].count"},
		{name: "negative count", req: req(Item{Model: h100, Count: 1}, Item{Model: l40s, Count: -2}), wantField: "items[1].count"},
		{name: "one item over max", req: req(Item{Model: h100, Count: 17}), wantField: "items[0].count"},
		{name: "total over max", req: req(Item{Model: h100, Count: 9}, Item{Model: l40s, Count: 8}), wantField: "items"},
		{name: "model twice", req: req(Item{Model: h100, Count: 1}, Item{Model: l40s, Count: 1}, Item{Model: h100, Count: 2}), wantField: "items[2].model"},
		{name: "33 labels", req: Request{Items: []Item{{Model: h100, Count: 1}}, Labels: manyLabels}, wantField: "labels"},
		{name: "empty label key", req: Request{Items: []Item{{Model: h100, Count: 1}}, Labels: map[string]string{"": "v"}}, wantField: "labels"},
		{name: "label key too long", req: Request{Items: []Item{{Model: h100, Count: 1}}, Labels: map[string]string{strings.Repeat("k", MaxLabelKeyLen+1): "v"}}, wantField: fmt.Sprintf("labels[%q]", strings.Repeat("k", MaxLabelKeyLen+1))},
		{name: "label key with =", req: Request{Items: []Item{{Model: h100, Count: 1}}, Labels: map[string]string{"a=b": "v"}}, wantField: `labels["a=b"]`},
		{name: "label value too long", req: Request{Items: []Item{{Model: h100, Count: 1}}, Labels: map[string]string{"k": strings.Repeat("v", MaxLabelValueLen+1)}}, wantField: `labels["k"]`},
		{name: "label value not UTF-8", req: Request{Items: []Item{{Model: h100, Count: 1}}, Labels: map[string]string{"k": "\xff"}}, wantField: `labels["k"]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateRequest(tt.req, tt.max)
			if tt.wantField == "" {
				if err != nil {
					t.Fatalf("ValidateRequest: %v, want nil", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("ValidateRequest = %v, want *ValidationError on %s", err, tt.wantField)
			}
			if ve.Field != tt.wantField {
				t.Fatalf("field = %q (%v), want %q", ve.Field, err, tt.wantField)
			}
			if !errors.Is(err, ErrInvalid) || ve.Reason == "" {
				t.Fatalf("error %v: want a reason and errors.Is(ErrInvalid)", err)
			}
		})
	}
}

func TestValidateAddress(t *testing.T) {
	for _, a := range []string{"0000:3b:00.0", "0001:ff:1f.7"} {
		if err := ValidateAddress(a); err != nil {
			t.Errorf("ValidateAddress(%q) = %v", a, err)
		}
	}
	for _, a := range []string{"", "3b:00.0", "0000:3B:00.0", "0000:3b:00.8", "0000:3b:00.0/../x", "0000:3b:00.0\n"} {
		if err := ValidateAddress(a); err == nil {
			t.Errorf("ValidateAddress(%q) = nil, want error", a)
		}
	}
}
