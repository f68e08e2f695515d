"""Coarser render meshes for software OpenGL: fewer triangles where a camera cannot see them.

Mesa's llvmpipe renders MuJoCo scenes at a cost that grows with the number of mesh triangles, and
CAD meshes (Meta-World's Sawyer arm: 67k triangles) are far finer than a 64-224 px camera
resolves. ``simplify_meshes`` merges the vertices of each mesh on a grid of ``cell`` metres
(vertex clustering) and keeps only the triangles that still have three distinct corners.

Only the face lists change: every merged corner is snapped onto an existing vertex of its cell
(the one nearest the cell's mean), so ``mesh_vert``, the convex hulls and the inertia the physics
uses stay exactly as compiled, and a simulation steps bit for bit as before. The renderer uploads
meshes when its GL context is made, so this must run before the first render.
"""

from __future__ import annotations

import math

import mujoco
import numpy as np


def simplify_meshes(model: mujoco.MjModel, cell: float) -> tuple[int, int]:
    """Cluster the vertices of every mesh of ``model`` on a ``cell``-metre grid, in place.

    Returns the number of triangles before and after. ``cell <= 0`` leaves the model as it is.
    Corners keep their own normals and texture coordinates, so shading stays smooth.
    """
    if not math.isfinite(cell):
        raise ValueError(f"cell must be a finite length in metres, got {cell}")
    before = int(model.mesh_facenum.sum())
    if cell <= 0:
        return before, before
    for mesh in range(model.nmesh):
        _simplify_mesh(model, mesh, cell)
    return before, int(model.mesh_facenum.sum())


def _simplify_mesh(model: mujoco.MjModel, mesh: int, cell: float) -> None:
    vert_start, nvert = model.mesh_vertadr[mesh], model.mesh_vertnum[mesh]
    face_start, nface = model.mesh_faceadr[mesh], model.mesh_facenum[mesh]
    if nface == 0:
        return
    verts = model.mesh_vert[vert_start : vert_start + nvert].astype(np.float64)
    faces = model.mesh_face[face_start : face_start + nface]
    _, cluster = np.unique(np.floor(verts / cell).astype(np.int64), axis=0, return_inverse=True)
    cluster = cluster.ravel()
    nclusters = int(cluster.max()) + 1
    # Each cluster's representative: its vertex nearest the cluster's mean.
    counts = np.bincount(cluster, minlength=nclusters)[:, None]
    means = np.stack(
        [np.bincount(cluster, weights=verts[:, k], minlength=nclusters) for k in range(3)], axis=1
    )
    means /= counts
    distance = np.linalg.norm(verts - means[cluster], axis=1)
    order = np.lexsort((distance, cluster))  # by cluster, nearest first
    first = np.ones(nvert, dtype=bool)
    first[1:] = cluster[order][1:] != cluster[order][:-1]
    representative = np.empty(nclusters, dtype=np.int64)
    representative[cluster[order][first]] = order[first]

    merged = representative[cluster][faces]
    keep = (
        (merged[:, 0] != merged[:, 1])
        & (merged[:, 1] != merged[:, 2])
        & (merged[:, 0] != merged[:, 2])
    )
    # Faces that collapse onto the same corners in the same winding draw the same pixels: keep
    # one (a cyclic rotation to the smallest corner first keeps the winding, which culling reads).
    kept = np.flatnonzero(keep)
    rolled = merged[kept]
    shift = np.argmin(rolled, axis=1)[:, None]
    rolled = np.take_along_axis(rolled, (np.arange(3)[None, :] + shift) % 3, axis=1)
    _, unique = np.unique(rolled, axis=0, return_index=True)
    kept = kept[np.sort(unique)]
    count = len(kept)
    rows = slice(face_start, face_start + count)
    old = slice(face_start, face_start + nface)
    model.mesh_face[rows] = merged[kept]
    model.mesh_facenormal[rows] = model.mesh_facenormal[old][kept]
    if model.mesh_texcoordnum[mesh] > 0:
        model.mesh_facetexcoord[rows] = model.mesh_facetexcoord[old][kept]
    model.mesh_facenum[mesh] = count


def pixel_footprint(model: mujoco.MjModel, camera: int, distance: float, height: int) -> float:
    """Metres one pixel spans at ``distance`` from ``camera`` in a ``height``-pixel image."""
    fovy = math.radians(float(model.cam_fovy[camera]))
    return 2.0 * distance * math.tan(fovy / 2.0) / height
