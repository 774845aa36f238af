"""Command line: ``python -m gs3d demo`` runs the worked example of the operator page;
``python -m gs3d config`` prints the build configuration."""
import sys

import numpy as np


def demo() -> None:
    import gs3d

    # The example of the aclnnGridSampler3DBackward page: NCDHW, float32, bilinear, zeros,
    # align_corners False, output_mask (True, True).
    x = np.arange(1, 10, dtype=np.float32).reshape(1, 1, 1, 3, 3)
    grid = np.array([-1, -1, 0, -1, 1, -1, -1, 0, 0, 0, 1, 0], dtype=np.float32).reshape(1, 1, 2, 2, 3)
    grad = np.ones((1, 1, 1, 2, 2), dtype=np.float32)
    dx, dgrid = gs3d.grid_sample_3d_backward(grad, x, grid, mode="bilinear", padding_mode="zeros",
                                             align_corners=False, output_mask=(True, True))
    out = gs3d.grid_sample_3d(x, grid)
    np.set_printoptions(suppress=True)
    print("aclnnGridSampler3DBackward worked example (NCDHW float32, bilinear, zeros, "
          "align_corners=False)")
    print("input_grad:", " ".join(f"{v:g}" for v in dx.ravel()))
    print("grid_grad: ", " ".join(f"{v:g}" for v in dgrid.ravel()))
    print("forward:   ", " ".join(f"{v:g}" for v in out.ravel()))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["demo"]:
        demo()
        return 0
    if argv == ["config"]:
        import gs3d
        gs3d.show_config()
        return 0
    print("usage: python -m gs3d {demo|config}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
