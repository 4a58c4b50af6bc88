// A sweep's report (safe_engine/pages/fronts.py): a point's settings and numbers on hover or focus, and the
// table sorted by the column clicked (numbers as numbers, blanks last).
(() => {
  const tip = document.getElementById("tip");
  const place = (x, y) => {
    tip.style.left = `${x + 14}px`;
    tip.style.top = `${y + 14}px`;
  };
  const show = (el, x, y) => {
    tip.textContent = el.dataset.tip;
    tip.hidden = false;
    place(x, y);
  };
  document.querySelectorAll("[data-tip]").forEach((el) => {
    el.addEventListener("mouseenter", (e) => show(el, e.pageX, e.pageY));
    el.addEventListener("mousemove", (e) => place(e.pageX, e.pageY));
    el.addEventListener("mouseleave", () => (tip.hidden = true));
    el.addEventListener("focus", () => {
      const box = el.getBoundingClientRect();
      show(el, box.right + window.scrollX, box.bottom + window.scrollY);
    });
    el.addEventListener("blur", () => (tip.hidden = true));
  });
  const value = (cell) => {
    const text = cell.dataset.value ?? cell.textContent;
    const number = parseFloat(text);
    return text === "" ? null : Number.isNaN(number) ? text : number;
  };
  document.querySelectorAll("table.sortable").forEach((table) => {
    table.querySelectorAll("th").forEach((th, column) => {
      th.addEventListener("click", () => {
        const ascending = th.dataset.sorted !== "ascending";
        table.querySelectorAll("th").forEach((other) => delete other.dataset.sorted);
        th.dataset.sorted = ascending ? "ascending" : "descending";
        const body = table.tBodies[0];
        const rows = [...body.rows];
        rows.sort((a, b) => {
          const x = value(a.cells[column]);
          const y = value(b.cells[column]);
          if (x === null || y === null) return (x === null) - (y === null);
          const order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
          return ascending ? order : -order;
        });
        rows.forEach((row) => body.appendChild(row));
      });
    });
  });
})();
