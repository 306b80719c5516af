package bench

import (
	"fmt"

	"k8s.io/client-go/dynamic"

	"github.com/frontdesk-dev/frontdesk/internal/localrun"
)

func dynamicFor(env *localrun.Environment) (dynamic.Interface, error) {
	dyn, err := dynamic.NewForConfig(env.ControlPlane.Config)
	if err != nil {
		return nil, fmt.Errorf("creating dynamic client: %w", err)
	}
	return dyn, nil
}
