"""The one engine of the gradient and CAM methods: a method is a `Spec` (pure pieces and its
options), `run` executes specs, `register` makes one `jaxsal.explain(method=name)`, and the
combinators `noise_tunnel` / `path_integral` turn any gradient or CAM spec into SmoothGrad- and
Integrated-Gradients-style methods of it; `jaxsal.engine.expression` reads a method written as text
("noise_tunnel(gradcam, n=16)", for the command line and sweep configs)."""
from jaxsal.engine.spec import Ctx, Prepared, Rows, Spec, Sums, objective  # noqa: F401
from jaxsal.engine.execute import CALL_ARGS, bind, method_function, register, run  # noqa: F401
from jaxsal.engine.combinators import noise_tunnel, path_integral, spec_of  # noqa: F401
